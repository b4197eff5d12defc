"""`ntp export`: write a plan's launch files for a framework."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ntp_planner.cli.options import Format, JsonOpt, PlanArg
from ntp_planner.cli.output import show, show_json
from topologies.errors import InputError

FormatOpt = Annotated[
    Format,
    typer.Option("--format", help="Megatron-LM, NeMo 1.x, NeMo 2.x, Megatron-Bridge (NeMo 3), torchtitan 0.3 or JSON."),
]
FolderOpt = Annotated[Path, typer.Option("--output", "-o", help="Folder to write into.")]
ExportReplanOpt = Annotated[
    Path | None, typer.Option("--replan", help="A re-plan from `ntp replan -o` (NTP settings).")
]
DataPathOpt = Annotated[str | None, typer.Option("--data-path", help="Training data (default: mock data).")]
SaveDirOpt = Annotated[str | None, typer.Option("--save-dir", help="Checkpoint folder.")]


def _unprintable(c: str) -> bool:
    """A control character other than a tab or a newline, or a lone surrogate."""
    return (ord(c) < 0x20 and c not in "\t\n") or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF


def check_path_text(value: str | None, option: str) -> None:
    """A path written into launch files must be text they can carry and show: no control character
    but a tab or a newline (no file system takes a NUL; an escape sequence would act on the
    terminal that shows the script), and no byte that is not UTF-8 (Python keeps one from the
    command line as a lone surrogate, which no UTF-8 file can hold: the write failed with a codec
    error). A tab or a newline is quoted like any other character and reaches the launcher
    unchanged (tests/ntp_planner/test_emitters.py, HOSTILE)."""
    if value is None:
        return
    bad = next((c for c in value if _unprintable(c)), None)
    if bad is None:
        return
    what = f"the control character {bad!r}" if ord(bad) < 0xD800 else "a byte that is not UTF-8 text"
    raise InputError(
        f"{option} {value!r} holds {what}, which no launch file should carry; give the path in printable characters"
    )


def export_cmd(
    plan_file: PlanArg,
    fmt: FormatOpt = "megatron",
    out_dir: FolderOpt = Path("."),
    replan_file: ExportReplanOpt = None,
    data_path: DataPathOpt = None,
    save_dir: SaveDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write launch files for Megatron-LM, NeMo 1.x, NeMo 2.x, Megatron-Bridge or torchtitan 0.3.

    \b
    Which versions each format is for:
      megatron    Megatron-LM pretrain_gpt.py (megatron-core 0.19.2's flags)
      nemo        NeMo 1.x (nemo-toolkit 1.x: megatron_gpt_pretraining.py)
      nemo2       NeMo 2.x (nemo-toolkit 2.0 to 2.7: nemo.collections.llm)
      bridge      Megatron-Bridge 0.3: NeMo 3 (nemo-toolkit 3.0) trains with it
      torchtitan  torchtitan 0.3
      json        the plan's layout, for any other tool

    \b
    Example: ntp export plan.json --format megatron -o launch/
    """
    from ntp_planner.emitters import EXPORT_FILES, check_options, export
    from ntp_planner.outputs import check_output_folder, write_folder
    from ntp_planner.plan import Plan
    from ntp_planner.replan_result import ReplanResult

    for option, value in (("--data-path", data_path), ("--save-dir", save_dir)):
        check_path_text(value, option)
    check_options(fmt, replan=replan_file, data_path=data_path, save_dir=save_dir)
    p = Plan.load(plan_file)
    replan_result = None if replan_file is None else ReplanResult.load(replan_file, p, "export")
    result = export(p, fmt, replan_result, data_path, save_dir)
    check_output_folder(out_dir, "--output", result.files, [plan_file, replan_file])
    scripts = [n for n in result.files if n.endswith(".sh")]
    write_folder(out_dir, result.files, scripts, replaces=EXPORT_FILES[fmt])  # all files or none
    for w in result.warnings:
        typer.echo(f"warning: {w}", err=True)
    if json_out:
        from ntp_planner.views.model import params_json

        files = [str(out_dir / n) for n in result.files]
        show_json({**params_json(p.model), "files": files, "warnings": result.warnings})
    else:
        for name in result.files:
            show(f"wrote {out_dir / name}")
