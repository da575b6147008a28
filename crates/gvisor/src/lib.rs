//! gVisor driver (being written).
