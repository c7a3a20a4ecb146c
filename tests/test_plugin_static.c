/* A host that links liblpx statically cannot share its registry with a
 * plugin that links the shared liblpx: the loader must see the second copy
 * and refuse the plugin with that reason instead of loading it into an
 * empty registry of its own. */
#include <stdlib.h>
#include "check.h"

static const char *plugin_dir;

static void test_second_copy_refused(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/lpx-test-badgather.so", plugin_dir);
    int kinds = lpx_kind_count();
    CHECK_ERR(lpx_plugin_load(path, NULL), LPX_EPLUGIN);
    CHECKF(strstr(lpx_last_error(), "another copy of liblpx"), "%s", lpx_last_error());
    CHECK(lpx_kind_count() == kinds && lpx_plugin_count() == 0);
}

int main(void)
{
    plugin_dir = getenv("LPX_TEST_PLUGIN_DIR");
    if (!plugin_dir) {
        printf("LPX_TEST_PLUGIN_DIR not set: skipping\n");
        return 77;
    }
    unsetenv("LPX_PLUGIN_PATH");
    if (lpx_init() != LPX_OK) return 1;   /* the built-in kinds count before and after */
    RUN(test_second_copy_refused);
    return CHECK_DONE();
}
