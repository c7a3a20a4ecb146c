/* lpx-fuzz-plugin.so: a plugin whose probe and init do what the fuzz input
 * says (tests/fuzz/fuzz_plugin_load.c drives it; the contract is in
 * fuzz_plugin_script.h). Input layout, each field read in turn (0 once the
 * input runs out):
 *
 *   u8  probe: %4 = 0 proceed, 1 decline (then a reason string),
 *       2 register a dtype from the probe (must be refused), then proceed
 *   u8  struct_size selector (sizeof, header size, too small, capacity,
 *       above capacity, 0, or a raw u16 that follows)
 *   u8  ABI major selector (%8 == 7: a raw u32 follows; else the right one)
 *   u8  ABI minor
 *   str name, str version, str description (length byte, bytes; 0xff = NULL)
 *   u8  fill_at: the step before which info is filled (>= steps: never)
 *   u8  nsteps (% 24), then per step an opcode byte and its operands:
 *       0 dtype      str name, u8 bits selector, u8 block
 *       1 op         u8 mode (even: a generated schema named by the str
 *                    that follows; odd: the str itself as the schema)
 *       2 kind       str name, u8 priority (0..4), u8 has unflatten
 *       3 kernel     u8 op selector, u8 key selector
 *       4 typed      u8 op selector, u8 key selector, u8 mode, str signature
 *       5 fallback   u8 key selector
 *       6 backend    str name, u8 device type
 *       7 fill info now
 *       8 return now with the status of the next byte
 *       9 lpx_plugin_load from inside init (must be refused)
 *      10 a kind through lpx_kind_register itself (journaled the same)
 *      11 a tensor of the newest kind, kept alive past the load
 *      12 rewrite info.abi_major / info.name after registering
 *   u8  final status selector (0: LPX_OK)
 * Strings are copied into a never-reused mmap arena: the registry may keep
 * the pointers (kind names) for the life of the process. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include "fuzz_plugin_script.h"

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;

static uint8_t u8(rd *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
static uint16_t u16(rd *r) { uint16_t v = u8(r); return (uint16_t)(v | (uint16_t)u8(r) << 8); }
static uint32_t u32(rd *r) { uint32_t v = u16(r); return v | (uint32_t)u16(r) << 16; }

/* a bump arena that is never reused (not the heap: nothing to leak) */
static char *arena;
static size_t arena_used, arena_cap;

static char *keep(const char *src, size_t n)
{
    if (!arena) {
        arena_cap = (size_t)1 << 30;
        void *a = mmap(NULL, arena_cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (a == MAP_FAILED) return NULL;
        arena = a;
    }
    if (arena_used + n + 1 > arena_cap) return NULL;
    char *s = arena + arena_used;
    memcpy(s, src, n);
    s[n] = 0;
    arena_used += n + 1;
    return s;
}

/* a string of the input, or NULL (length byte 0xff) */
static const char *str(rd *r, size_t max)
{
    uint8_t len = u8(r);
    if (len == 0xff) return NULL;
    size_t n = len < max ? len : max;
    char buf[256];
    size_t k = n < r->n ? n : r->n;
    memcpy(buf, r->p, k);
    memset(buf + k, 0, n - k);
    r->p += k;
    r->n -= k;
    /* a C string: whatever follows the first NUL is cut, as in a real plugin */
    return keep(buf, strnlen(buf, n));
}

static fzp_script *script(void)
{
    return (fzp_script *)dlsym(RTLD_DEFAULT, FZP_SYMBOL);
}

static const lpx_status statuses[] = {LPX_EINVAL, LPX_ENOMEM, LPX_ENOTIMPL, LPX_EPLUGIN, LPX_EABI, LPX_EINTERNAL,
                                      LPX_ENOTFOUND, (lpx_status)-1000, (lpx_status)7};

static lpx_status status_of(uint8_t b)
{
    return b ? statuses[(b - 1) % (sizeof statuses / sizeof statuses[0])] : LPX_OK;
}

/* ---- what the registrations point at ------------------------------------- */

static void to_f32(const void *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = ((const uint8_t *)src)[i];
}
static void from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    (void)flags;
    for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)(src[i] > 0 ? (src[i] < 255 ? src[i] : 255) : 0);
}

static lpx_status kernel(lpx_call *c)
{
    (void)c;
    return LPX_ENOTIMPL;
}

static lpx_status typed_kernel(lpx_tensor *x, double s, lpx_tensor **out)
{
    (void)x, (void)s;
    *out = NULL;
    return LPX_ENOTIMPL;
}

static lpx_status unflatten(const lpx_kind *kind, lpx_dtype dt, int ndim, const int64_t *shape, lpx_tensor *const *inner,
                            int ninner, const void *meta, size_t meta_size, lpx_tensor **out)
{
    (void)kind, (void)dt, (void)ndim, (void)shape, (void)inner, (void)ninner, (void)meta, (void)meta_size;
    *out = NULL;
    return LPX_EINVAL;
}

static void *be_alloc(void *self, lpx_device d, size_t n) { (void)self, (void)d, (void)n; return NULL; }
static void be_free(void *self, lpx_device d, void *p, size_t n) { (void)self, (void)d, (void)p, (void)n; }
static lpx_status be_copy(void *self, void *dst, lpx_device dd, const void *src, lpx_device sd, size_t n)
{
    (void)self, (void)dst, (void)dd, (void)src, (void)sd, (void)n;
    return LPX_EDEVICE;
}

/* vtables must outlive a successful registration: never-reused slots */
#define NVT 4096
static lpx_kind_i vts[NVT];
static lpx_backend_i bes[NVT];
static int nvt, nbe;

static lpx_op pick_op(rd *r, const fzp_script *s)
{
    uint8_t sel = u8(r);
    switch (sel % 3) {
    case 0: return s->nops ? s->ops[s->nops - 1] : LPX_OP_add;
    case 1: return (lpx_op)(u8(r) % LPX_OP_BUILTIN_COUNT);
    default: return (lpx_op)(int8_t)u8(r) * 9;
    }
}

static int pick_key(rd *r, const fzp_script *s)
{
    uint8_t sel = u8(r);
    switch (sel % 3) {
    case 0: return s->nkinds ? s->kind_key(s->kinds[s->nkinds - 1]) : LPX_KEY_CPU;
    case 1: return LPX_KEY_CPU;
    default: return (int8_t)u8(r);
    }
}

static void note(int *counter, lpx_status st)
{
    if (!st) (*counter)++;
}

/* ---- probe and init -------------------------------------------------------- */

LPX_PLUGIN_EXPORT int lpx_plugin_probe(const lpx_host *host, char *reason, size_t len)
{
    fzp_script *s = script();
    if (!s) return 0;
    rd r = {s->data, s->size};
    s->probe_ran = 1;
    uint8_t p = u8(&r) % 4;
    if (p == 1) {
        const char *why = str(&r, 200);
        snprintf(reason, len, "%s", why ? why : "");
        return 1;
    }
    if (p == 2) {
        /* registering from the probe is refused */
        static const lpx_dtype_traits t = {.struct_size = sizeof t, .name = "fzp_probe_dtype", .bits = 8,
                                           .block = 1, .to_f32 = to_f32, .from_f32 = from_f32};
        lpx_dtype d;
        if (host->dtype_register(host, &t, &d) == LPX_OK) s->registered[0]++;   /* the target flags it */
    }
    return 0;
}

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    fzp_script *s = script();
    if (!s) return LPX_EINVAL;
    rd r = {s->data, s->size};
    s->init_ran = 1;
    uint8_t probe = u8(&r) % 4;
    if (probe == 1) (void)str(&r, 200);

    /* the info header as declared */
    static const size_t sizes[] = {sizeof(lpx_plugin_info), LPX_PLUGIN_INFO_HEADER_SIZE,
                                   LPX_PLUGIN_INFO_HEADER_SIZE - 1, 8, LPX_PLUGIN_INFO_CAPACITY,
                                   LPX_PLUGIN_INFO_CAPACITY + 1, 0};
    uint8_t ssel = u8(&r);
    size_t struct_size = ssel < sizeof sizes / sizeof sizes[0] ? sizes[ssel] : (ssel & 1) ? u16(&r) : sizeof(lpx_plugin_info);
    uint8_t asel = u8(&r);
    uint32_t major = asel % 8 == 7 ? u32(&r) : LPX_PLUGIN_ABI_MAJOR;
    uint32_t minor = u8(&r);
    const char *name = str(&r, 100), *version = str(&r, 100), *desc = str(&r, 300);
    uint8_t fill_at = u8(&r);
    int nsteps = u8(&r) % 24;

#define FILL()                                                        \
    do {                                                              \
        if (!s->info_filled) {                                        \
            info->struct_size = struct_size;                          \
            info->abi_major = major;                                  \
            info->abi_minor = minor;                                  \
            info->name = name;                                        \
            info->version = version;                                  \
            if (struct_size >= sizeof(lpx_plugin_info)) info->description = desc; \
            s->info_filled = 1;                                       \
        }                                                             \
    } while (0)

    for (int i = 0; i < nsteps; i++) {
        if (i == fill_at) FILL();
        uint8_t opc = u8(&r) % 13;
        lpx_status st = LPX_OK;
        switch (opc) {
        case 0: {
            static const int bits[] = {8, 16, 4, 32, 1, 0, 7, 64};
            const char *n = str(&r, 80);
            lpx_dtype_traits t = {.struct_size = sizeof t, .name = n, .bits = bits[u8(&r) % 8], .block = u8(&r) % 4,
                                  .is_float = true, .max = 255, .to_f32 = to_f32, .from_f32 = from_f32};
            lpx_dtype d;
            st = host->dtype_register(host, &t, &d);
            note(&s->registered[0], st);
            break;
        }
        case 1: {
            uint8_t mode = u8(&r);
            const char *n = str(&r, 200);
            char schema[300];
            if (mode % 2 == 0) snprintf(schema, sizeof schema, "%s(Tensor x, float s) -> Tensor", n ? n : "");
            else snprintf(schema, sizeof schema, "%s", n ? n : "");
            lpx_op op = -1;
            st = host->op_register(host, n ? schema : NULL, &op);
            note(&s->registered[1], st);
            if (!st && s->nops < FZP_MAX_REC) s->ops[s->nops++] = op;
            break;
        }
        case 2:
        case 10: {
            if (nvt >= NVT) break;
            lpx_kind_i *vt = &vts[nvt++];
            vt->struct_size = sizeof *vt;
            vt->abi_version = LPX_KIND_ABI_VERSION;
            vt->name = str(&r, 80);
            vt->priority = u8(&r) % 5;
            vt->unflatten = u8(&r) & 1 ? unflatten : NULL;
            const lpx_kind *k = NULL;
            st = opc == 2 ? host->kind_register(host, vt, &k) : s->kind_register(vt, &k);
            note(&s->registered[2], st);
            if (!st && s->nkinds < FZP_MAX_REC) s->kinds[s->nkinds++] = k;
            break;
        }
        case 3: {
            lpx_op op = pick_op(&r, s);
            int key = pick_key(&r, s);
            st = host->kernel_register(host, op, key, kernel, NULL);
            note(&s->registered[3], st);
            if (!st && s->nkernels < FZP_MAX_REC) s->kernels[s->nkernels++] = (fzp_kernel_rec){op, key};
            break;
        }
        case 4: {
            lpx_op op = pick_op(&r, s);
            int key = pick_key(&r, s);
            uint8_t mode = u8(&r);
            const char *sig = str(&r, 120);
            st = host->kernel_register_typed(host, op, key, mode % 2 ? sig : "Tensor, float -> Tensor",
                                             (void (*)(void))typed_kernel);
            note(&s->registered[3], st);
            if (!st && s->nkernels < FZP_MAX_REC) s->kernels[s->nkernels++] = (fzp_kernel_rec){op, key};
            break;
        }
        case 5: {
            int key = pick_key(&r, s);
            st = host->fallback_register(host, key, kernel, NULL);
            note(&s->registered[4], st);
            if (!st && s->nfallbacks < FZP_MAX_REC) s->fallback_keys[s->nfallbacks++] = key;
            break;
        }
        case 6: {
            if (nbe >= NVT) break;
            lpx_backend_i *b = &bes[nbe++];
            b->struct_size = sizeof *b;
            b->name = str(&r, 40);
            b->device_type = (int8_t)u8(&r);
            b->alloc = be_alloc;
            b->free = be_free;
            b->copy = be_copy;
            int key = 0;
            st = host->backend_register(host, b, &key);
            note(&s->registered[5], st);
            if (!st && s->nbackends < FZP_MAX_REC) s->device_types[s->nbackends++] = b->device_type;
            break;
        }
        case 7: FILL(); break;
        case 8: {
            lpx_status ret = status_of(u8(&r));
            if (!ret && s->force_fail) ret = LPX_EINVAL;
            if (ret) s->error(ret, "fuzz plugin: failing at step %d as told", i);
            return ret;
        }
        case 9: {
            const lpx_plugin *p = NULL;
            st = s->plugin_load(host->plugin_path, &p);
            if (st == LPX_OK) s->registered[0] += 1000;   /* a nested load went through: the target flags it */
            break;
        }
        case 11: {
            if (!s->nkinds || s->kept) break;
            int64_t n = 4;
            lpx_tensor *inner = NULL, *t = NULL;
            lpx_device cpu = {LPX_DEVICE_CPU, 0};
            if (s->tensor_new(LPX_F32, 1, &n, cpu, &inner)) break;
            if (!s->tensor_new_kind(s->kinds[s->nkinds - 1], LPX_F32, 1, &n, cpu, &inner, 1, "m", 1, &t))
                s->kept = t;
            s->tensor_release(inner);
            break;
        }
        case 12: {
            uint8_t what = u8(&r);
            if (what & 1) info->abi_major = u32(&r);
            else info->name = str(&r, 100);
            break;
        }
        }
        (void)st;
    }
    if (fill_at == nsteps) FILL();
    lpx_status ret = status_of(u8(&r));
    if (!ret && s->force_fail) ret = LPX_EINVAL;
    if (ret) s->error(ret, "fuzz plugin: init returns %d as told", (int)ret);
    return ret;
}
