//! Template root filesystems: built with debootstrap, cached by content hash. (Being written.)
