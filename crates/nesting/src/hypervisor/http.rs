//! HTTP/1.1 over a unix socket (in progress).
