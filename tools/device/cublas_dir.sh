#!/usr/bin/env bash
# Prints the directory of cuBLAS (libcublas.so.13) on the GPU machine, or nothing: the CUDA
# toolkit's, else that of python3's nvidia-cublas wheel. For the daemon's LD_LIBRARY_PATH (the
# bundle carries no CUDA library of its own).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null); do
  if [ -e "$d/libcublas.so.13" ]; then
    echo "$d"
    exit 0
  fi
done
