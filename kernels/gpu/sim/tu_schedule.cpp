// The plugin source schedule.cu compiled as C++ against the emulator (PA_SIM).
#include "../schedule.cu"
