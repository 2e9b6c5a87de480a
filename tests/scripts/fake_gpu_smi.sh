#!/bin/sh
# nvidia-smi for test hosts without GPUs (tests of the restart's host check): one idle GPU per
# host. The host whose hostname has a file broken-<hostname> beside this script's link plays
# one whose driver has failed: nvidia-smi's own message, and its exit status 9.
if [ -e "$(dirname "$0")/broken-$(hostname)" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
  exit 9
fi
case " $* " in
  *" -L "*) echo "GPU 0: NVIDIA H200 (UUID: GPU-fake-$(hostname))" ;;
  *"-lms"*) exit 0 ;;   # the live sampler: no rows
  *"--query-gpu=index,uuid,driver_version,memory.used,memory.total"*)
    echo "0, GPU-fake-$(hostname), 550.54.15, 0, 143771" ;;
esac
exit 0
