# Sourced by the device runbooks: MPS for one measurement, on private directories under /tmp, and
# always stopped before the script ends (the device's settings are not ours to leave changed).
#   start_mps   starts the control daemon (status 1 when it cannot) and arms the stop on exit
#   stop_mps    stops it and unsets the directories, so later processes run without MPS
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/verifyd-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/verifyd-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  trap stop_mps EXIT
  if ! nvidia-cuda-mps-control -d; then
    echo "nvidia-cuda-mps-control -d failed"
    stop_mps
    return 1
  fi
  sleep 1
}
stop_mps() {
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  sleep 1
  trap - EXIT
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
