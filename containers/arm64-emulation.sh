#!/usr/bin/env bash
# Run arm64 (Jetson-like) programs on this x86 machine through QEMU user-mode emulation, as the arm64
# systemd container test needs (tests/integration/arm64root.py; docs/agent-service.md). Needs root and
# the packages qemu-user-static binfmt-support. Idempotent.
#   F (fix binary): the interpreter is opened now, so it works inside chroots and containers
#   C (credentials): a setuid arm64 program (sudo) runs as its owner, not as the caller
# C applies to every arm64 setuid binary on this machine: meant for CI machines and test laptops.
set -euo pipefail
grep -q binfmt_misc /proc/mounts || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
entry=/proc/sys/fs/binfmt_misc/qemu-aarch64
if [ -f "$entry" ] && grep -q '^flags: .*C' "$entry" && grep -q '^flags: .*F' "$entry"; then
  exit 0
fi
[ -f "$entry" ] && echo -1 > "$entry"
# the magic and mask of Debian's /usr/share/binfmts/qemu-aarch64 (an aarch64 ELF executable or shared object)
magic='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
printf '%s' ":qemu-aarch64:M::${magic}:${mask}:/usr/libexec/qemu-binfmt/aarch64-binfmt-P:POCF" \
  > /proc/sys/fs/binfmt_misc/register
grep '^flags' "$entry"
