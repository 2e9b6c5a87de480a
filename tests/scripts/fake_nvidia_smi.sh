#!/bin/sh
# nvidia-smi for test hosts without GPUs: replays rows recorded on a real H200
# ($FAKE_NVIDIA_SMI_ROWS, e.g. tests/data/nvidia-smi-h200.csv), one row per -lms period.
# The node whose MLAUNCH_NODE_RANK is $FAKE_NVIDIA_SMI_NO_DRIVER plays one without a driver.
if [ "${MLAUNCH_NODE_RANK:-x}" = "${FAKE_NVIDIA_SMI_NO_DRIVER:-none}" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
  exit 9
fi
case " $* " in
  *" -L "*) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"; exit 0 ;;
esac
ms= prev=
for a; do [ "$prev" = -lms ] && ms=$a; prev=$a; done
[ -n "$ms" ] || { head -n 1 "$FAKE_NVIDIA_SMI_ROWS"; exit 0; }
period=$(awk "BEGIN { print $ms / 1000 }")
while :; do
  while IFS= read -r row; do
    printf '%s\n' "$row" || exit 0
    sleep "$period"
  done <"$FAKE_NVIDIA_SMI_ROWS"
done
