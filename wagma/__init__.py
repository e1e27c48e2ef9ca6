"""Training algorithms (WAGMA-SGD and baselines) on flat parameter buffers, imbalance models, HDF5 results
and analysis."""
