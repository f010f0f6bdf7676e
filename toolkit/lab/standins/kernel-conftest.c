/* Writes the stand-in nvidia.ko (lab stand-in: no real kernel module is built). */
#include <stdio.h>
int main(int argc, char **argv) {
    printf("version: %s\nkernel: %s\nsigned: no\nlab stand-in nvidia.ko\n", LAB_DRIVER_VERSION, argc > 1 ? argv[1] : "?");
    return 0;
}
