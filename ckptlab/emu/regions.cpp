// regions.cpp: where things are in the process: the module's code and data, the runtime's own.
//
//   The module (a kernel file linked with the runtime, one shared object) is found once, by the
//   address of a function of its own. Its executable segment is the kernel's code less the
//   runtime's, whose sections build.py renames (emu_runtime_text, _data, _bss) so that their
//   bounds are linker symbols here. Timer ticks (signals.cpp) use in_kernel_code to stop a
//   thread only in the kernel's own code; the memory hooks (memory.cpp, objects.cpp) use
//   in_module and in_runtime_data to tell a kernel's statics from the runtime's state.
#include "runtime.h"

#include <link.h>

extern "C" char __start_emu_runtime_text[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_emu_runtime_text[] __attribute__((weak, visibility("hidden")));
extern "C" char __start_emu_runtime_data[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_emu_runtime_data[] __attribute__((weak, visibility("hidden")));
extern "C" char __start_emu_runtime_bss[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_emu_runtime_bss[] __attribute__((weak, visibility("hidden")));

static uintptr_t g_mod_lo[16], g_mod_hi[16], g_text_lo, g_text_hi, g_bias;
static int g_nmod = -1;

void find_module_ranges() {
    if (g_nmod >= 0) return;  // once: the module does not move
    g_nmod = 0;
    dl_iterate_phdr(
        [](struct dl_phdr_info* info, size_t, void*) -> int {
            const uintptr_t me = reinterpret_cast<uintptr_t>(&find_module_ranges);
            bool mine = false;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const auto& ph = info->dlpi_phdr[i];
                const uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
                mine |= ph.p_type == PT_LOAD && me >= lo && me < hi;
            }
            if (!mine) return 0;
            g_bias = info->dlpi_addr;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const auto& ph = info->dlpi_phdr[i];
                if (ph.p_type != PT_LOAD || g_nmod >= 16) continue;
                const uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
                g_mod_lo[g_nmod] = lo, g_mod_hi[g_nmod++] = hi;
                if (ph.p_flags & PF_X) g_text_lo = lo, g_text_hi = hi;
            }
            return 1;
        },
        nullptr);
}

bool in_module(uintptr_t a) {
    for (int i = 0; i < g_nmod; ++i)
        if (a >= g_mod_lo[i] && a < g_mod_hi[i]) return true;
    return false;
}
static bool within(uintptr_t a, const char* lo, const char* hi) {
    return lo && a >= reinterpret_cast<uintptr_t>(lo) && a < reinterpret_cast<uintptr_t>(hi);
}
// The kernel's own code: the module's, not the runtime's (build.py renames its sections).
// Two more kinds of code share the module's text: PLT stubs, which no launch runs (build.py
// compiles with -fno-plt: a stop in one would name no source line), and the runtime's
// out-of-line std::map code, which runs only under the heap lock (w->busy keeps ticks off).
bool in_kernel_code(uintptr_t pc) {
    return pc >= g_text_lo && pc < g_text_hi &&
           !within(pc, __start_emu_runtime_text, __stop_emu_runtime_text);
}
bool in_runtime_data(uintptr_t a) {
    return within(a, __start_emu_runtime_data, __stop_emu_runtime_data) ||
           within(a, __start_emu_runtime_bss, __stop_emu_runtime_bss);
}
// Offset of an instruction in the module, for addr2line (0: not the module's).
uint64_t pc_offset(void* pc) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(pc);
    return p >= g_text_lo && p < g_text_hi ? p - g_bias : 0;
}
