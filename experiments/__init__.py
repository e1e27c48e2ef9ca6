"""Command-line entry points: training and benchmark runs with their models, datasets and configurations."""
