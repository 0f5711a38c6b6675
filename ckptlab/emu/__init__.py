"""The CPU emulator: runs kernels/*.cu unchanged on a CPU and counts every global-memory byte.
(Being built: see issue 2.)"""
