"""Words and pictures: the figure style, the pipeline's figures, summary.md, the markdown tables."""
