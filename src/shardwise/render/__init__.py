"""Views of explanations: terminal (rich), figures (matplotlib: SVG and PNG), HTML."""
