#!/bin/sh
# NVIDIA-Linux-x86_64-@DRIVER_VERSION@.run (lab stand-in for NVIDIA's driver installer).
# Takes the real installer's flags; installs the stand-in userspace (nvidia-smi, nvidia-modprobe,
# nvidia-persistenced, libcuda.so.1) and, without --no-kernel-module, the stand-in kernel module
# (loaded like the real installer does: /run/lab-standin/sys/module/nvidia, /proc/devices-style
# file). A tar payload follows the marker line, as in the real makeself archive.
set -eu
VERSION=@DRIVER_VERSION@
kernel_module=1
log=/var/log/nvidia-installer.log
for arg in "$@"; do
  case "$arg" in
    -v|--version) echo "nvidia-installer:  version $VERSION (lab stand-in)"; exit 0 ;;
    --no-kernel-module|--no-kernel-modules) kernel_module=0 ;;
    -s|--silent|-q|--no-questions|--ui=none|-a|--accept-license|--dkms|--no-dkms|--kernel-module-type=open|\
    --kernel-module-type=proprietary|-m=kernel-open|-m=kernel|--no-x-check|--no-nouveau-check|--disable-nouveau|\
    --no-cc-version-check|--no-drm|--install-libglvnd|--no-install-libglvnd|--no-opengl-files|--no-backup|\
    --no-systemd|--tmpdir=*|--log-file-name=*|--kernel-source-path=*|--kernel-name=*|-z|--no-rebuild-initramfs) ;;
    *) echo "ERROR: Unrecognized option: '$arg' (lab stand-in nvidia-installer)" >&2; exit 1 ;;
  esac
  case "$arg" in --log-file-name=*) log=${arg#--log-file-name=} ;; esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "ERROR: nvidia-installer must be run as root (lab stand-in)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
line=$(awk '/^__LAB_PAYLOAD_BELOW__$/ { print NR + 1; exit }' "$0")
tail -n +"$line" "$0" | tar -xzf - -C "$tmp"
libdir=/usr/lib/x86_64-linux-gnu
mkdir -p "$libdir" /usr/lib/lab-standin /var/lib/lab-standin /usr/share/lab-standin
install -m 0755 "$tmp/nvidia-smi" /usr/bin/nvidia-smi
install -m 0755 "$tmp/nvidia-modprobe" /usr/bin/nvidia-modprobe
install -m 0755 "$tmp/nvidia-persistenced" /usr/bin/nvidia-persistenced
install -m 0644 "$tmp/labstandin.py" /usr/lib/lab-standin/labstandin.py
install -m 0755 "$tmp/libcuda.so.$VERSION" "$libdir/libcuda.so.$VERSION"
ln -sf "libcuda.so.$VERSION" "$libdir/libcuda.so.1"
ln -sf libcuda.so.1 "$libdir/libcuda.so"
echo "$VERSION" > /usr/share/lab-standin/driver-version
command -v ldconfig >/dev/null && ldconfig
{
  echo "nvidia-installer log file '$log' (lab stand-in)"
  echo "creation time: $(date)"
  echo "installer version: $VERSION"
  echo "command line: $0 $*"
} > "$log"
if [ "$kernel_module" = 1 ]; then
  loaded=$(cat /run/lab-standin/sys/module/nvidia/version 2>/dev/null || true)
  if [ -n "$loaded" ] && [ "$loaded" != "$VERSION" ]; then
    modprobe -r nvidia_uvm nvidia_modeset nvidia_drm nvidia_peermem 2>/dev/null || true
    modprobe -r nvidia
  fi
  echo "$VERSION" > /var/lib/lab-standin/kernel-module-version
  modprobe nvidia
  echo "Installing kernel module $VERSION (lab stand-in: no kernel module is built)" >> "$log"
else
  echo "Skipping kernel module (--no-kernel-module)" >> "$log"
fi
echo "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $VERSION) is now complete. (lab stand-in)"
exit 0
__LAB_PAYLOAD_BELOW__
