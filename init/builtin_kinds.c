/* Registers the kinds built into liblpx. Called once by lpx_init after the
 * CPU backend, so kind handlers can rely on the dense ops. */
#include "../core/lpx_internal.h"

lpx_status lpx_float8_register_kind(void);
lpx_status lpx_nf4_register_kind(void);
lpx_status lpx_float8_weight_register_kind(void);
lpx_status lpx_dtensor_register_kind(void);
lpx_status lpx_optim_state_register_kinds(void);

lpx_status lpx_builtin_kinds_init(void)
{
    lpx_status st = lpx_float8_register_kind();
    if (!st) st = lpx_nf4_register_kind();
    if (!st) st = lpx_float8_weight_register_kind();
    if (!st) st = lpx_dtensor_register_kind();
    if (!st) st = lpx_optim_state_register_kinds();
    return st;
}
