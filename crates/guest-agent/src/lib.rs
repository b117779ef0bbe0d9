//! Guest agent wire frames (in progress).
