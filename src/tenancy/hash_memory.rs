//! The working memory of one argon2 computation (19 MiB with the default
//! parameters), taken for that computation and given back to the operating system
//! when it ends.
//!
//! Left to the allocator, glibc keeps such blocks: after the first large free it
//! raises its mmap threshold, so later ones come from per-thread arenas and stay
//! there, one or two per blocking thread: a flood of failed logins grew the server
//! by hundreds of MiB. On Linux the memory is therefore an anonymous mapping of its
//! own, unmapped on drop; elsewhere it is a heap allocation (the system allocators
//! of macOS and musl return blocks this large by themselves). This module must
//! never hand out the memory of a live mapping to two computations at once.

use argon2::Block;

/// The operating system would not give the memory.
#[derive(Debug, thiserror::Error)]
#[error("no memory for a password hash ({0} KiB)")]
pub struct NoMemory(pub usize);

#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
))]
pub use mapped::HashMemory;

#[cfg(not(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
)))]
pub use heap::HashMemory;

#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
))]
mod mapped {
    use std::ffi::{c_int, c_long, c_void};
    use std::ptr::NonNull;

    use super::{Block, NoMemory};

    // The constants of <sys/mman.h>, the same on each of the 64-bit Linux
    // architectures this is built for (where `off_t` is a `long`).
    const PROT_READ: c_int = 0x1;
    const PROT_WRITE: c_int = 0x2;
    const MAP_PRIVATE: c_int = 0x02;
    const MAP_ANONYMOUS: c_int = 0x20;
    const MAP_FAILED: *mut c_void = usize::MAX as *mut c_void;

    unsafe extern "C" {
        fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            offset: c_long,
        ) -> *mut c_void;
        fn munmap(addr: *mut c_void, len: usize) -> c_int;
    }

    /// Zeroed memory for a number of argon2 blocks: an anonymous private mapping
    /// of its own, unmapped when dropped.
    pub struct HashMemory {
        start: NonNull<Block>,
        blocks: usize,
    }

    // SAFETY: the mapping is reached only through this value (nothing else has its
    // address), so moving the value to another thread moves every access with it.
    unsafe impl Send for HashMemory {}

    impl HashMemory {
        pub fn new(blocks: usize) -> Result<HashMemory, NoMemory> {
            let len = blocks
                .checked_mul(size_of::<Block>())
                .filter(|&len| len > 0)
                .ok_or(NoMemory(blocks))?;
            // SAFETY: a new anonymous mapping at an address of the kernel's choice
            // touches no existing memory; failure is MAP_FAILED, checked below.
            let start = unsafe {
                mmap(
                    std::ptr::null_mut(),
                    len,
                    PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if start == MAP_FAILED {
                return Err(NoMemory(blocks));
            }
            // Page-aligned, so aligned for `Block` (64 bytes).
            let start = NonNull::new(start.cast::<Block>()).ok_or(NoMemory(blocks))?;
            Ok(HashMemory { start, blocks })
        }
    }

    impl AsMut<[Block]> for HashMemory {
        fn as_mut(&mut self) -> &mut [Block] {
            // SAFETY: the mapping is `blocks` blocks long, readable and writable,
            // zero-filled by the kernel (any bits make a valid `Block`), aligned,
            // and borrowed through `&mut self`, so once at a time and never past
            // the drop that unmaps it.
            unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.blocks) }
        }
    }

    impl Drop for HashMemory {
        fn drop(&mut self) {
            // SAFETY: exactly the range `new` mapped, no longer borrowed (`as_mut`
            // borrows `self`), unmapped once. A failure could only be a bad range.
            unsafe {
                munmap(self.start.as_ptr().cast(), self.blocks * size_of::<Block>());
            }
        }
    }
}

#[cfg(not(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
)))]
mod heap {
    use super::{Block, NoMemory};

    /// Zeroed memory for a number of argon2 blocks, from the heap.
    pub struct HashMemory(Vec<Block>);

    impl HashMemory {
        pub fn new(blocks: usize) -> Result<HashMemory, NoMemory> {
            let mut memory = Vec::new();
            memory
                .try_reserve_exact(blocks)
                .map_err(|_| NoMemory(blocks))?;
            memory.resize(blocks, Block::new());
            Ok(HashMemory(memory))
        }
    }

    impl AsMut<[Block]> for HashMemory {
        fn as_mut(&mut self) -> &mut [Block] {
            &mut self.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_zeroed_writable_and_the_size_asked() {
        let mut memory = HashMemory::new(19 * 1024).expect("memory");
        let blocks = memory.as_mut();
        assert_eq!(blocks.len(), 19 * 1024);
        assert!(blocks.iter().all(|b| b.as_ref().iter().all(|w| *w == 0)));
        blocks[19 * 1024 - 1].as_mut()[127] = 7;
        assert_eq!(memory.as_mut()[19 * 1024 - 1].as_ref()[127], 7);
    }
}
