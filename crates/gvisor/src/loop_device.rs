//! Loop devices, attached by ioctl. `mount -o loop` (util-linux) first reads every loop
//! device's backing file from sysfs, to refuse a file attached twice; loop devices stay on the
//! host after their sandbox, so each mount cost O(devices the host ever had at once): 36 ms on
//! a host that had held 1,000 sandboxes, against 8 ms on a fresh one. Asking the kernel for a
//! free device costs the same whatever the count. Each file here is attached once, by the one
//! sandbox or volume that owns it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

// linux/loop.h
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Attempts at a free device that a concurrent attach may take first.
const ATTEMPTS: usize = 16;

#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    size_limit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Attaches `image` to a free loop device and hands the device's path to `mount`, which mounts
/// it. The device detaches itself once the filesystem is unmounted (autoclear); if `mount`
/// fails, it is detached at once.
pub(crate) fn mount_attached(
    image: &Path,
    mount: impl Fn(&Path) -> io::Result<()>,
) -> io::Result<()> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    for _ in 0..ATTEMPTS {
        // SAFETY: an ioctl without an argument on a descriptor we own.
        let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if number < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = format!("/dev/loop{number}");
        let device = OpenOptions::new().read(true).write(true).open(&path)?;
        match configure(&device, &backing) {
            Ok(()) => {}
            // Taken by a concurrent attach between the two calls: ask again.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
            Err(e) => return Err(e),
        }
        // The device stays open until the filesystem holds it: with autoclear, the last close
        // of an unmounted device detaches it.
        return mount(Path::new(&path)).inspect_err(|_| {
            // SAFETY: an ioctl without an argument on a descriptor we own.
            unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD) };
        });
    }
    Err(io::Error::other(
        "no free loop device after several attempts",
    ))
}

fn configure(device: &File, backing: &File) -> io::Result<()> {
    // SAFETY: all-zero is a valid value of these plain-integer structs.
    let mut config: LoopConfig = unsafe { std::mem::zeroed() };
    config.fd = backing.as_raw_fd() as u32;
    config.info.flags = LO_FLAGS_AUTOCLEAR;
    // SAFETY: LOOP_CONFIGURE reads a `struct loop_config`, which `LoopConfig` lays out
    // (linux/loop.h); both descriptors are open for the call's duration.
    let result = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE, &config) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The loop device `image` is attached to, if any (from sysfs: each device's backing file).
pub(crate) fn backing(image: &Path) -> Option<std::path::PathBuf> {
    let image = std::fs::canonicalize(image).ok()?;
    let devices = std::fs::read_dir("/sys/block").ok()?;
    for device in devices.flatten() {
        let name = device.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("loop")) else {
            continue;
        };
        let backing = device.path().join("loop/backing_file");
        let Ok(file) = std::fs::read_to_string(&backing) else {
            continue; // not attached
        };
        if Path::new(file.trim_end()) == image {
            return Some(std::path::PathBuf::from(format!("/dev/{name}")));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_match_linux_loop_h() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }
}
