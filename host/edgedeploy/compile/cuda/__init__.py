"""The CUDA wing: the schedule rules TVM's dlight runs for GPU kernels (tensor cores, tiles, windows, injective),
the CUDA source fix, the layout stage and the toolchains that turn TVM's CUDA source into device code."""
