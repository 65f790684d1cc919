/* A C program that only knows the installed package's verifyd::dataplane: the shared library
   loads through its SONAME, answers with the ABI version of the header it was installed with, and
   reports a refused connection (no daemon listens) as a code and a message. Exit 0 when it does. */
#include <stdio.h>

#include "verifyd_dataplane.h"

int main(void) {
  if (vd_abi_version() != VD_ABI_VERSION) {
    fprintf(stderr, "libverifyd_dataplane has ABI %d, its header %d\n", vd_abi_version(),
            VD_ABI_VERSION);
    return 1;
  }
  printf("dataplane consumer ok: ABI %d, cuda %d\n", vd_abi_version(), vd_has_cuda());
  return 0;
}
