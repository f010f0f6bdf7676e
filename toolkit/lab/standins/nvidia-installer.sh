#!/bin/sh
# NVIDIA-Linux-x86_64-@DRIVER_VERSION@.run (lab stand-in for NVIDIA's driver installer).
# Takes the real installer's flags; installs the stand-in userspace (nvidia-smi, nvidia-modprobe,
# nvidia-persistenced, libcuda.so.1) and, without --no-kernel-module, builds the stand-in kernel
# module with the real toolchain against /lib/modules/$(uname -r)/build, installs it, registers it
# with DKMS when dkms exists, and loads it. It refuses what the real one refuses, with its
# messages: no cc/make/stdio.h, no kernel headers, nouveau bound, a loaded module in use.
# A tar payload follows the marker line, as in the real makeself archive.
set -eu
VERSION=@DRIVER_VERSION@
kernel_module=1
dkms=0
allow_running=0
no_nouveau_check=0
check_alternate=1
kernel_source_path=""
signing_key=""
signing_pub=""
module_type=""
log=/var/log/nvidia-installer.log
for arg in "$@"; do
  case "$arg" in
    -v|--version) echo "nvidia-installer:  version $VERSION (lab stand-in)"; exit 0 ;;
    --no-kernel-module|--no-kernel-modules) kernel_module=0 ;;
    --dkms) dkms=1 ;;
    --allow-installation-with-running-driver) allow_running=1 ;;
    --no-nouveau-check) no_nouveau_check=1 ;;
    --no-check-for-alternate-installs) check_alternate=0 ;;
    --kernel-source-path=*) kernel_source_path=${arg#--kernel-source-path=} ;;
    --module-signing-secret-key=*) signing_key=${arg#*=} ;;
    --module-signing-public-key=*) signing_pub=${arg#*=} ;;
    --kernel-module-type=open|-m=kernel-open|--kernel-module-build-directory=kernel-open) module_type=open ;;
    --kernel-module-type=proprietary|-m=kernel|--kernel-module-build-directory=kernel) module_type=proprietary ;;
    -s|--silent|-q|--no-questions|--ui=none|-a|--accept-license|--no-dkms|--no-x-check|--disable-nouveau|\
    --no-cc-version-check|--no-drm|--install-libglvnd|--no-install-libglvnd|--no-opengl-files|--no-backup|\
    --no-systemd|--tmpdir=*|--log-file-name=*|--kernel-name=*|-z|--no-rebuild-initramfs) ;;
    *) echo "ERROR: Unrecognized option: '$arg' (lab stand-in nvidia-installer)" >&2; exit 1 ;;
  esac
  case "$arg" in --log-file-name=*) log=${arg#--log-file-name=} ;; esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "ERROR: nvidia-installer must be run as root (lab stand-in)" >&2
  exit 1
fi
{
  echo "nvidia-installer log file '$log' (lab stand-in)"
  echo "creation time: $(date)"
  echo "installer version: $VERSION"
  echo "command line: $0 $*"
} > "$log"
# As nvidia-installer in --silent mode: warnings and errors on stderr, the default answer to every
# question (ABORT where it asks continue-or-abort), and the closing line naming the log
# (misc.c, kernel.c, install-from-cwd.c of NVIDIA/nvidia-installer).
warn() { echo "WARNING: $*" >&2; echo "WARNING: $*" >> "$log"; }
fail() {
  echo "ERROR: $*" >&2; echo "ERROR: $*" >> "$log"
  echo "ERROR: Installation has failed.  Please see the file '$log' for details.  You may find suggestions on fixing installation problems in the README available on the Linux driver download page at www.nvidia.com." >&2
  exit 1
}
# check_for_alternate_install (misc.c): a distribution's driver packages leave this marker; the default answer
# (silent mode too) to "continue or abort" is abort, before anything is built or installed.
alt=/usr/lib/nvidia/alternate-install-present
if [ "$check_alternate" = 1 ] && [ -e "$alt" ]; then
  warn "The NVIDIA driver appears to have been installed previously using a different installer. To prevent potential conflicts, it is recommended either to update the existing installation using the same mechanism by which it was originally installed, or to uninstall the existing installation before installing this driver.$( [ -s "$alt" ] && printf '\n\nPlease review the message provided by the maintainer of this alternate installation method and decide how to proceed:\n%s' "$(cat "$alt")")"
  echo "ERROR: The installation was canceled due to the availability or presence of an alternate driver installation. Please see $log for more details." >&2
  echo "ERROR: The installation was canceled due to the availability or presence of an alternate driver installation." >> "$log"
  exit 1
fi
sysmod=/run/lab-standin/sys/module
kernel=$(uname -r)
skip_module_load=0
src=${kernel_source_path:-/lib/modules/$kernel/build}
# The flavour `lab` (the lab as it was before the stock flavours) has no toolchain or headers to
# give: there the build checks are skipped and the module is written, not built; said in the log.
lab_flavour=0
grep -qs '"flavour": "lab"' /etc/lab-standin/lab.json && lab_flavour=1
# The kernel module type (kernel.c valid_kernel_module_types): the open modules are not valid where a GPU
# does not support them (before Turing), the proprietary ones not where a GPU requires the open ones
# (Blackwell); of two valid types the default is open. A type forced on GPUs it does not fit is installed
# with the installer's warning.
arch=$(python3 -c 'import sys; sys.path.insert(0, "/usr/lib/lab-standin"); import labstandin as l; print(l.load_config().get("arch", ""))' 2>/dev/null || true)
case "$arch" in maxwell|pascal|volta) valid=proprietary ;; blackwell) valid=open ;; *) valid="open proprietary" ;; esac
if [ -z "$module_type" ]; then
  module_type=${valid%% *}
elif ! echo " $valid " | grep -q " $module_type "; then
  license="MIT/GPL"; [ "$module_type" = proprietary ] && license="NVIDIA Proprietary"
  warn "The '$license' kernel modules are incompatible with the GPU(s) detected on this system. They will be installed anyway, but are not expected to work."
fi
echo "Kernel module type: $module_type" >> "$log"
if [ "$kernel_module" = 1 ]; then
  # Loaded NVIDIA modules (of another version) are unloaded first; one in use stops the install.
  loaded=$(cat "$sysmod/nvidia/version" 2>/dev/null || true)
  if [ -n "$loaded" ]; then
    for m in nvidia_uvm nvidia_drm nvidia_modeset nvidia_peermem nvidia; do
      modprobe -r "$m" 2>/dev/null || true
    done
    if [ -d "$sysmod/nvidia" ]; then
      warn "An NVIDIA kernel module 'nvidia' appears to be already loaded in your kernel.  This may be because it is in use (for example, by an X server, a CUDA program, or the NVIDIA Persistence Daemon), but this may also happen if your kernel was configured without support for module unloading.  Some of the sanity checks that nvidia-installer performs to detect potential installation problems are not possible while an NVIDIA kernel module is running."
      [ "$allow_running" = 1 ] || fail "An NVIDIA kernel module 'nvidia' appears to already be loaded in your kernel.  This may be because it is in use (for example, by an X server, a CUDA program, or the NVIDIA Persistence Daemon).  Please make sure you have stopped all programs using the NVIDIA GPU(s) (lab stand-in)"
      warn "Continuing installation despite the presence of a loaded NVIDIA kernel module.  Some sanity checks will not be performed.  It is strongly recommended that you reboot your computer after installation is complete."
      skip_module_load=1
    fi
  fi
  # nouveau bound to a GPU (/sys/bus/pci/devices/*/driver): silent mode writes the disable files
  # if they are missing, then aborts (the default answer) unless --allow-installation-with-running-driver.
  if grep -qx nouveau /run/lab-standin/sys/bus/pci/devices/*/driver 2>/dev/null && [ "$no_nouveau_check" = 0 ]; then
    warn "The Nouveau kernel driver is currently in use by your system.  This driver is incompatible with the NVIDIA driver, and must be disabled before proceeding."
    present=""
    for d in /etc/modprobe.d /usr/lib/modprobe.d; do
      [ -f "$d/nvidia-installer-disable-nouveau.conf" ] && present="$present $d/nvidia-installer-disable-nouveau.conf"
    done
    if grep -qs '^blacklist nouveau' /etc/modprobe.d/*.conf /usr/lib/modprobe.d/*.conf || [ -n "$present" ]; then
      warn "One or more modprobe configuration files to disable Nouveau are already present at:${present:- /etc/modprobe.d}.  Please be sure you have rebooted your system since these files were written.  If you have rebooted, then Nouveau may be enabled for other reasons, such as being included in the system initial ramdisk or in your X configuration file.  Please consult the NVIDIA driver README and your Linux distribution's documentation for details on how to correctly disable the Nouveau kernel driver."
    else
      for d in /etc/modprobe.d /usr/lib/modprobe.d; do
        mkdir -p "$d"; printf 'blacklist nouveau\noptions nouveau modeset=0\n' > "$d/nvidia-installer-disable-nouveau.conf"
      done
      warn "One or more modprobe configuration files to disable Nouveau have been written.  You will need to reboot your system and possibly rebuild the initramfs before these changes can take effect."
    fi
    [ "$allow_running" = 1 ] || fail "nvidia-installer is not able to perform some of the sanity checks which detect potential installation problems while Nouveau is loaded.  (default answer in silent mode: abort installation)"
    skip_module_load=1
  fi
  # check_development_tools (misc.c): cc and make in PATH, then the libc headers.
  if [ "$lab_flavour" = 0 ]; then
  command -v cc >/dev/null || [ -n "${CC:-}" ] || fail "Unable to find the development tool \`cc\` in your path; please make sure that you have the package 'gcc' installed.  If gcc is installed on your system, then please check that \`cc\` is in your PATH."
  command -v make >/dev/null || fail "Unable to find the development tool \`make\` in your path; please make sure that you have the package 'make' installed.  If make is installed on your system, then please check that \`make\` is in your PATH."
  [ -e /usr/include/stdio.h ] || fail "You do not appear to have libc header files installed on your system.  Please install your distribution's libc development package."
  [ -d "$src" ] || fail "Unable to find the kernel source tree for the currently running kernel.  Please make sure you have installed the kernel source files for your kernel and that they are properly configured; on Red Hat Linux systems, for example, be sure you have the 'kernel-source' or 'kernel-devel' RPM installed.  If you know the correct kernel source files are installed, you may specify the kernel source path with the '--kernel-source-path' command line option."
  else
    echo "lab flavour 'lab': no toolchain or kernel headers checked, the module is not built" >> "$log"
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
line=$(awk '/^__LAB_PAYLOAD_BELOW__$/ { print NR + 1; exit }' "$0")
tail -n +"$line" "$0" | tar -xzf - -C "$tmp"
if [ "$kernel_module" = 1 ]; then
  # Build the stand-in module with the real toolchain (its Makefile compiles a C file that
  # includes stdio.h), against the running kernel's headers.
  echo "$module_type" > "$tmp/kernel/module-type"
  if [ "$lab_flavour" = 1 ]; then
    printf 'version: %s\nkernel: %s\nsigned: no\ntype: %s\nlab stand-in nvidia.ko (not built: flavour lab)\n' "$VERSION" "$kernel" "$module_type" > "$tmp/kernel/nvidia.ko"
  else
    # As install-from-cwd.c: the make command and its output go to the log, the step's name to the screen.
    if ! make -C "$tmp/kernel" KERNELRELEASE="$kernel" KERNEL_SOURCES="$src" > "$tmp/make.out" 2>&1; then
      { echo "-> The command \`cd ./kernel; /usr/bin/make -k -j$(nproc) NV_EXCLUDE_KERNEL_MODULES=\"\" SYSSRC=\"$src\" SYSOUT=\"$src\" NV_KERNEL_MODULES=\"nvidia nvidia-uvm nvidia-modeset nvidia-drm\"\` failed with the following output:"
        cat "$tmp/make.out"; } >> "$log"
      fail "An error occurred while performing the step: \"Building kernel modules\". See $log for details."
    fi
    cat "$tmp/make.out" >> "$log"
  fi
  if [ -n "$signing_key" ] && [ -n "$signing_pub" ]; then
    [ -f "$signing_key" ] && [ -f "$signing_pub" ] || fail "Unable to sign the kernel module: $signing_key or $signing_pub not found."
    # Signed with the key pair given: the stand-in records the certificate's sha256 (the kernel checks it
    # against the enrolled keys).
    sed -i 's/^signed: no$/signed: yes/' "$tmp/kernel/nvidia.ko"
    echo "signer: $(sha256sum "$signing_pub" | cut -d' ' -f1)" >> "$tmp/kernel/nvidia.ko"
  fi
  echo "Kernel module built against kernel $kernel (headers $src)" >> "$log"
fi
libdir=/usr/lib/x86_64-linux-gnu
mkdir -p "$libdir" /usr/lib/lab-standin /var/lib/lab-standin /usr/share/lab-standin
install -m 0755 "$tmp/nvidia-smi" /usr/bin/nvidia-smi
install -m 0755 "$tmp/nvidia-modprobe" /usr/bin/nvidia-modprobe
install -m 0755 "$tmp/nvidia-persistenced" /usr/bin/nvidia-persistenced
install -m 0644 "$tmp/labstandin.py" /usr/lib/lab-standin/labstandin.py
# The previous driver's files go first (nvidia-uninstall), or ldconfig would point libcuda.so.1 at
# the highest-numbered one left behind.
for f in "$libdir"/libcuda.so.[0-9]*; do
  [ -e "$f" ] && [ "$f" != "$libdir/libcuda.so.$VERSION" ] && rm -f "$f"
done
install -m 0755 "$tmp/libcuda.so.$VERSION" "$libdir/libcuda.so.$VERSION"
ln -sf "libcuda.so.$VERSION" "$libdir/libcuda.so.1"
ln -sf libcuda.so.1 "$libdir/libcuda.so"
echo "$VERSION" > /usr/share/lab-standin/driver-version
command -v ldconfig >/dev/null && ldconfig
if [ "$kernel_module" = 1 ]; then
  dest=/lib/modules/$kernel/kernel/drivers/video
  mkdir -p "$dest"
  install -m 0644 "$tmp/kernel/nvidia.ko" "$dest/nvidia.ko"
  echo "Installing kernel module $VERSION for kernel $kernel (lab stand-in: no real module)" >> "$log"
  # dkms_register_module (misc.c): "If dkms(8) or tar(1) are missing, there is nothing to do here."
  # The previous driver is uninstalled first, its DKMS registration with it (nvidia-uninstall), this
  # version's too: a reinstall (another module type) registers its source afresh.
  if command -v dkms >/dev/null; then
    for old in $(ls /var/lib/dkms/nvidia 2>/dev/null); do
      dkms remove -m nvidia -v "$old" --all >> "$log" 2>&1 || true
    done
  fi
  if [ "$dkms" = 1 ] && command -v dkms >/dev/null && command -v tar >/dev/null; then
    mkdir -p "$tmp/dkms/dkms_source_tree" "$tmp/dkms/dkms_binaries/$kernel"
    cp -a "$tmp/kernel/." "$tmp/dkms/dkms_source_tree/"
    rm -f "$tmp/dkms/dkms_source_tree/nvidia.ko"
    cp "$tmp/kernel/nvidia.ko" "$tmp/dkms/dkms_binaries/$kernel/nvidia.ko"
    tar -C "$tmp/dkms" -czf "$tmp/nvidia-dkms.tar.gz" dkms_source_tree dkms_binaries
    if dkms ldtarball "$tmp/nvidia-dkms.tar.gz" >> "$log" 2>&1 && dkms install -m nvidia -v "$VERSION" -k "$kernel" >> "$log" 2>&1 \
       && dkms status -m nvidia -v "$VERSION" -k "$kernel" | grep -q ': installed'; then
      echo "Registered the kernel module sources with DKMS" >> "$log"
    else
      warn "Failed to register the NVIDIA kernel modules with DKMS. The NVIDIA kernel modules will be installed, but will not be automatically rebuilt if you change your kernel."
    fi
  fi
  echo "$VERSION" > /var/lib/lab-standin/kernel-module-version
  if [ "$skip_module_load" = 0 ]; then
    modprobe nvidia 2>>"$log" || fail "Unable to load the kernel module 'nvidia.ko'.  This happens most frequently when this kernel module was built against the wrong or improperly configured kernel sources, with a version of gcc that differs from the one used to build the target kernel, or if another driver, such as nouveau, is present and prevents the NVIDIA kernel module from obtaining ownership of the NVIDIA device(s), or no NVIDIA device installed in this system is supported by this NVIDIA Linux graphics driver release.  (modprobe: $(tail -n 1 "$log"))"
  fi
else
  echo "Skipping kernel module (--no-kernel-module)" >> "$log"
fi
echo "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $VERSION) is now complete. (lab stand-in)"
exit 0
__LAB_PAYLOAD_BELOW__
