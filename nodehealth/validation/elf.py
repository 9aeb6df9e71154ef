"""The dynamic symbols a shared library exports, read from its ELF file in pure Python.

Only ELF64 (x86-64, aarch64, ppc64le: what GPU nodes run), either byte order. The symbol table
is found through the section headers (``.dynsym`` and the string table it links to); a file
without section headers is read through its ``PT_DYNAMIC`` segment (``DT_SYMTAB``,
``DT_STRTAB``, the symbol count from ``DT_HASH`` or ``DT_GNU_HASH``), which is what the dynamic
loader itself uses.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Optional

SHT_DYNSYM = 11
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 0, 4, 5, 6, 10, 11
DT_GNU_HASH = 0x6FFFFEF5
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK = 1, 2
STT_NAMES = {0: "notype", 1: "object", 2: "func", 3: "section", 4: "file", 5: "common", 6: "tls", 10: "gnu_ifunc"}
SYM_SIZE = 24  # Elf64_Sym


class ElfError(Exception):
    """Not an ELF64 file, or one whose dynamic symbol table cannot be read."""


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: str  # func, object, ...
    binding: str  # global, weak, local
    defined: bool
    value: int


def _cstr(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    return data[offset : end if end >= 0 else len(data)].decode("utf-8", errors="replace")


class _Elf:
    def __init__(self, data: bytes) -> None:
        if len(data) < 64 or data[:4] != b"\x7fELF":
            raise ElfError("not an ELF file")
        if data[4] != 2:
            raise ElfError("not a 64-bit ELF file (only ELF64 is read)")
        if data[5] not in (1, 2):
            raise ElfError(f"unknown ELF byte order {data[5]}")
        self.data = data
        self.e = "<" if data[5] == 1 else ">"
        (self.phoff, self.shoff, _, _, self.phentsize, self.phnum, self.shentsize, self.shnum, _) = struct.unpack_from(
            self.e + "QQIHHHHHH", data, 32
        )

    def unpack(self, fmt: str, offset: int) -> tuple[int, ...]:
        try:
            return struct.unpack_from(self.e + fmt, self.data, offset)
        except struct.error:
            raise ElfError(f"truncated at offset {offset:#x}") from None

    def symbols(self, entries: bytes, strtab: bytes) -> list[Symbol]:
        out = []
        for off in range(SYM_SIZE, len(entries) - SYM_SIZE + 1, SYM_SIZE):  # entry 0 is the null symbol
            name_off, info, _other, shndx, value, _size = struct.unpack_from(self.e + "IBBHQQ", entries, off)
            bind = {0: "local", STB_GLOBAL: "global", STB_WEAK: "weak"}.get(info >> 4, str(info >> 4))
            out.append(
                Symbol(
                    _cstr(strtab, name_off), STT_NAMES.get(info & 0xF, str(info & 0xF)), bind, shndx != SHN_UNDEF, value
                )
            )
        return out

    def from_sections(self) -> Optional[list[Symbol]]:
        if not self.shoff or not self.shnum:
            return None
        sections = [self.unpack("IIQQQQIIQQ", self.shoff + i * self.shentsize) for i in range(self.shnum)]
        for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
            if kind == SHT_DYNSYM:
                if entsize not in (0, SYM_SIZE) or link >= len(sections):
                    raise ElfError("malformed .dynsym section")
                str_off, str_size = sections[link][4], sections[link][5]
                return self.symbols(self.data[offset : offset + size], self.data[str_off : str_off + str_size])
        return None

    def from_dynamic(self) -> list[Symbol]:
        loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
        dynamic: Optional[tuple[int, int]] = None
        for i in range(self.phnum):
            kind, _flags, offset, vaddr, _paddr, filesz, _memsz, _align = self.unpack(
                "IIQQQQQQ", self.phoff + i * self.phentsize
            )
            if kind == PT_LOAD:
                loads.append((vaddr, offset, filesz))
            elif kind == PT_DYNAMIC:
                dynamic = (offset, filesz)
        if dynamic is None:
            raise ElfError("no dynamic symbol table (not a shared library?)")

        def file_offset(addr: int) -> int:
            for vaddr, offset, filesz in loads:
                if vaddr <= addr < vaddr + filesz:
                    return addr - vaddr + offset
            raise ElfError(f"address {addr:#x} is in no loaded segment")

        tags: dict[int, int] = {}
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = self.unpack("qQ", off)
            if tag == DT_NULL:
                break
            tags.setdefault(tag, val)
        if DT_SYMTAB not in tags or DT_STRTAB not in tags:
            raise ElfError("PT_DYNAMIC has no DT_SYMTAB/DT_STRTAB")
        symtab, strtab = file_offset(tags[DT_SYMTAB]), file_offset(tags[DT_STRTAB])
        count = self._count(tags, file_offset)
        strings = self.data[strtab : strtab + tags.get(DT_STRSZ, len(self.data) - strtab)]
        return self.symbols(self.data[symtab : symtab + count * SYM_SIZE], strings)

    def _count(self, tags: dict[int, int], file_offset: Callable[[int], int]) -> int:
        if DT_HASH in tags:
            return self.unpack("II", file_offset(tags[DT_HASH]))[1]  # nchain = number of symbols
        if DT_GNU_HASH not in tags:
            raise ElfError("no DT_HASH or DT_GNU_HASH: the symbol count is unknown")
        base = file_offset(tags[DT_GNU_HASH])
        nbuckets, symoffset, bloom_size, _shift = self.unpack("IIII", base)
        buckets = base + 16 + bloom_size * 8
        last = max((self.unpack("I", buckets + 4 * i)[0] for i in range(nbuckets)), default=0)
        if last < symoffset:
            return symoffset
        chains = buckets + 4 * nbuckets
        while not self.unpack("I", chains + 4 * (last - symoffset))[0] & 1:
            last += 1
        return last + 1


def dynamic_symbols(path: str, use_sections: bool = True) -> list[Symbol]:
    """Every entry of ``path``'s dynamic symbol table (``use_sections=False``: via PT_DYNAMIC)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ElfError(f"{path}: {exc.strerror or exc}") from None
    elf = _Elf(data)
    found = elf.from_sections() if use_sections else None
    return found if found is not None else elf.from_dynamic()


def exported(path: str, prefix: str = "", use_sections: bool = True) -> list[str]:
    """Sorted names of the defined global or weak functions, objects and TLS variables ``path`` exports."""
    names = {
        s.name
        for s in dynamic_symbols(path, use_sections)
        if s.defined
        and s.binding in ("global", "weak")
        and s.kind in ("func", "object", "gnu_ifunc", "tls")
        and s.name.startswith(prefix)
    }
    return sorted(names)
