//! The process-wide rustls crypto provider. Every TLS user (the gRPC listeners and clients, the
//! UFM client) calls [`install_crypto_provider`] first, so exactly one provider (ring) is used.

use std::sync::Once;

/// Installs ring as the process's rustls provider; later calls do nothing.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err means another provider was installed first, which is equally fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
