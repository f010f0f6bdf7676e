#!/bin/sh
# pve1 stage 1: runs as PID 1 of pve1's new PID namespace, in its own mount, UTS, IPC and cgroup
# namespaces, inside the lab's network namespace, with the controller's tools. Builds pve1's
# root and pivots into it; every mount here exists only in this mount namespace.
# (lab stand-in for a Proxmox host's boot; environment from toolkit/lab/system.py)
set -eu
R=$LAB_ROOT
mount -t overlay "toolkit-lab-$LAB_HOSTNAME" -o "lowerdir=$LAB_LOWER,upperdir=$LAB_UPPER,workdir=$LAB_WORK" "$R"
mount -t proc proc "$R/proc"
# A stock flavour's package mirror (toolkit/lab/aptrepo.py), read-only.
if [ -n "${LAB_MIRROR:-}" ]; then
  mount --bind "$LAB_MIRROR" "$R/srv/lab-standin-mirror"
  mount -o remount,bind,ro "$R/srv/lab-standin-mirror"
fi
# The appliance index pveam downloads from: the controller's directory, so that a CT template built after
# this host started appears whole (toolkit.lab.system.place_index).
mount --bind "$LAB_APLINFO" "$R/var/lib/lab-standin/aplinfo"
mount -o remount,bind,ro "$R/var/lib/lab-standin/aplinfo"
# A cluster's /etc/pve/nodes: the same directory on every node, as pmxcfs shows it.
if [ -n "${LAB_CLUSTER_NODES:-}" ]; then
  mount --bind "$LAB_CLUSTER_NODES" "$R/etc/pve/nodes"
fi
# A fresh sysfs shows this network namespace's interfaces (LXC reads /sys/class/net).
mount -t sysfs sysfs "$R/sys"
mount -t tmpfs -o mode=755,size=1m cgroup_root "$R/sys/fs/cgroup"
# The same hierarchies as the controller, seen from pve1's cgroup namespace: LXC makes its
# containers' groups under pve1's own (toolkit-lab), which `down` removes.
grep -E ' - cgroup2? ' /proc/self/mountinfo | while read -r line; do
  mnt=$(echo "$line" | cut -d' ' -f5)
  fstype=$(echo "$line" | sed 's/.* - //' | cut -d' ' -f1)
  sopts=$(echo "$line" | sed 's/.* - //' | cut -d' ' -f3)
  name=$(basename "$mnt")
  mkdir -p "$R/sys/fs/cgroup/$name"
  if [ "$fstype" = cgroup2 ]; then
    mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup/$name"
  else
    opts=$(echo "$sopts" | tr ',' '\n' | grep -vE '^(rw|ro)$' | paste -sd, -)
    mount -t cgroup -o "$opts" cgroup "$R/sys/fs/cgroup/$name"
  fi
done
mount -t tmpfs -o mode=755,size=16m,nosuid dev "$R/dev"
mknod -m 666 "$R/dev/null" c 1 3
mknod -m 666 "$R/dev/zero" c 1 5
mknod -m 666 "$R/dev/full" c 1 7
mknod -m 666 "$R/dev/random" c 1 8
mknod -m 666 "$R/dev/urandom" c 1 9
mknod -m 666 "$R/dev/tty" c 5 0
mkdir -p "$R/dev/pts" "$R/dev/shm" "$R/dev/net"
mknod -m 666 "$R/dev/net/tun" c 10 200
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o mode=1777,size=64m shm "$R/dev/shm"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
# The stand-in GPUs: what the nvidia module's nodes look like on a host (docs/story.md, CUDA inside the container; docs/provision.md:
# major 195, minor N per GPU, 254 modeset, 255 ctl). No driver owns major 195 on this kernel,
# so opening one gives ENXIO where the devices cgroup allows it, EPERM where it does not.
# Only the flavour `lab` has them from boot; on a real host (the stock flavours) nothing makes
# them but nvidia-modprobe (directly, or through persistenced and nvidia-smi).
if [ "${LAB_PREMADE_NODES:-1}" = 1 ]; then
  i=0
  while [ "$i" -lt "$LAB_GPUS" ]; do
    mknod -m 666 "$R/dev/nvidia$i" c 195 "$i"
    i=$((i + 1))
  done
  mknod -m 666 "$R/dev/nvidiactl" c 195 255
  mknod -m 666 "$R/dev/nvidia-modeset" c 195 254
fi
mount -t tmpfs -o mode=755,size=256m run "$R/run"
mount -t tmpfs -o mode=1777,size=1g tmp "$R/tmp"
# /proc/sys stays writable: a read-only bind over it would make this /proc "not fully visible"
# and the kernel then refuses the /proc mount of every unprivileged container (seen: "Failed to
# mount proc ... Operation not permitted" for `--unprivileged 1`). pve1 shares this machine's
# kernel, so the systemd units that set global kernel state are masked instead (system.py).
hostname "$LAB_HOSTNAME"
cd "$R"
mkdir -p .lab-oldroot
pivot_root . .lab-oldroot
cd /
umount -l /.lab-oldroot
rmdir /.lab-oldroot
# systemd as pve1's init, as on a Proxmox host, so the units roles install really run. The
# `container` variable makes it behave as in a container (no udev, no kernel tuning).
exec /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin container=lxc \
  /lib/systemd/systemd --system --log-target=console --show-status=no
