"""Writes a shared object cut inside its first PT_LOAD segment: the ELF and program headers stay
readable, but that segment (and every later one) runs past the end of the file, whatever the
build type (a cut at half the file still holds every segment in a debug-info build)."""
import struct
import sys

data = open(sys.argv[1], "rb").read()
if data[:4] != b"\x7fELF" or data[4] != 2:
    sys.exit("truncate_elf: %s is not a 64-bit ELF" % sys.argv[1])
endian = "<" if data[5] == 1 else ">"
phoff, = struct.unpack_from(endian + "Q", data, 0x20)
phentsize, phnum = struct.unpack_from(endian + "HH", data, 0x36)
headers_end = phoff + phentsize * phnum
for i in range(phnum):
    p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(endian + "IIQQQQ", data,
                                                              phoff + i * phentsize)
    if p_type == 1 and p_filesz > 0:  # PT_LOAD
        start = max(p_offset, headers_end)
        end = p_offset + p_filesz
        cut = (start + end) // 2
        if not start <= cut < end:
            sys.exit("truncate_elf: no room to cut inside the first PT_LOAD [%d, %d)" %
                     (p_offset, end))
        break
else:
    sys.exit("truncate_elf: no PT_LOAD segment with file contents")
open(sys.argv[2], "wb").write(data[:cut])
