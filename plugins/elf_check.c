/* What can be checked of a plugin file before dlopen maps it: junk in
 * LPX_PLUGIN_PATH must be skipped with a reason, not kill or hang every lpx
 * process at init. dlopen of a FIFO blocks forever, of a truncated ELF
 * faults (SIGBUS) when a segment maps past the end of the file, of an ELF
 * for another machine fails late. Checked here: a regular file (opened
 * non-blocking, so a FIFO cannot hang the open), an ELF header of this
 * machine (class, byte order, machine, a shared object), and program and
 * section header tables and every segment lying inside the file.
 * What no check can catch (docs/PLUGINS.md): damaged contents inside the
 * file (relocations, the dynamic section, code), constructors that crash,
 * a file replaced between this check and dlopen. */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "plugin_internal.h"

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#elif defined(__powerpc64__)
#define HOST_MACHINE EM_PPC64
#else
#define HOST_MACHINE EM_NONE   /* unknown host: the machine is not checked */
#endif

static bool inside(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

bool lpx_plugin_file_ok(const char *path, char *reason, size_t len)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(reason, len, "cannot open: %s", strerror(errno));
        return false;
    }
    struct stat sb;
    bool ok = false;
    ElfW(Ehdr) eh;
    if (fstat(fd, &sb) != 0) {
        snprintf(reason, len, "cannot stat: %s", strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        snprintf(reason, len, "not a regular file (%s)", S_ISDIR(sb.st_mode) ? "a directory" : S_ISFIFO(sb.st_mode) ? "a FIFO"
                                                         : "a device or socket");
    } else if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG)) {
        snprintf(reason, len, "not an ELF shared object (%lld bytes)", (long long)sb.st_size);
    } else if (eh.e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
               eh.e_ident[EI_DATA] != (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB) ||
               (HOST_MACHINE != EM_NONE && eh.e_machine != HOST_MACHINE)) {
        snprintf(reason, len, "an ELF file for another machine (class %d, data %d, machine %d)", eh.e_ident[EI_CLASS],
                 eh.e_ident[EI_DATA], eh.e_machine);
    } else if (eh.e_type != ET_DYN) {
        snprintf(reason, len, "an ELF file but not a shared object (type %d)", eh.e_type);
    } else {
        uint64_t size = (uint64_t)sb.st_size;
        if (eh.e_phentsize != sizeof(ElfW(Phdr)) || !inside(eh.e_phoff, (uint64_t)eh.e_phnum * eh.e_phentsize, size)) {
            snprintf(reason, len, "damaged ELF: the program headers lie outside the %llu-byte file",
                     (unsigned long long)size);
        } else if (eh.e_shoff && !inside(eh.e_shoff, (uint64_t)eh.e_shnum * eh.e_shentsize, size)) {
            snprintf(reason, len, "truncated or damaged ELF: the section headers lie outside the %llu-byte file",
                     (unsigned long long)size);
        } else {
            ok = true;
            for (int i = 0; i < eh.e_phnum && ok; i++) {
                ElfW(Phdr) ph;
                if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph)) != (ssize_t)sizeof ph) {
                    snprintf(reason, len, "cannot read program header %d", i);
                    ok = false;
                } else if (ph.p_type == PT_LOAD && !inside(ph.p_offset, ph.p_filesz, size)) {
                    snprintf(reason, len, "truncated or damaged ELF: segment %d [%llu, +%llu) lies outside the "
                             "%llu-byte file", i, (unsigned long long)ph.p_offset, (unsigned long long)ph.p_filesz,
                             (unsigned long long)size);
                    ok = false;
                }
            }
        }
    }
    close(fd);
    return ok;
}
