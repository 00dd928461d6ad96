/*
 * devices.h — `cellm devices`: the Vulkan devices this machine offers and
 * what each can do (docs/gpu.md).
 */
#ifndef CELLM_DEVICES_H
#define CELLM_DEVICES_H

int cmd_devices(int argc, char **argv);

#endif /* CELLM_DEVICES_H */
