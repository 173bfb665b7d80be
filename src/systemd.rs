//! sd_notify.
