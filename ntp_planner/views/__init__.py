"""Rich renderers and plots: return renderables, never print."""
