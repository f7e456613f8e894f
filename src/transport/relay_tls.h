// Internal to the relay transport: TLS on relay links (docs/protocol.md,
// "Relay tree", "TLS"): the endpoint's context, peer name checks, and
// explanations of what went wrong in terms of the relay's options. Used by
// the link code (relay_link.cc) on the endpoint's I/O thread; the
// functions keep no state (OpenSSL's error queue aside, which they clear).
#ifndef REFIT_TRANSPORT_RELAY_TLS_H_
#define REFIT_TRANSPORT_RELAY_TLS_H_

#include <openssl/ssl.h>

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "refit/status.h"
#include "transport/relay_store.h"

namespace refit::internal {

// The endpoint's TLS context, one for both roles (server of its children's
// links, client of its parent link): TLS 1.3 only, no session tickets, the
// certificate chain and key of `t`, peers checked against t.ca_file.
// kInvalidArgument naming the file that cannot be loaded (or a key that
// does not belong to the certificate); `name` starts messages.
Result<std::unique_ptr<asio::ssl::context>> MakeRelayTlsContext(
    const RelayTlsOptions& t, const std::string& name);

// Makes the handshake on `ssl` also require the peer's certificate to
// carry `peer_name` (a DNS subjectAltName, or an IP one for an IP
// literal). False when OpenSSL refuses the name.
bool RequirePeerName(SSL* ssl, const std::string& peer_name);

// True when the peer's certificate on `ssl` names `member` (DNS
// subjectAltName, or the subject CN when it has none; no wildcards).
bool PeerCertificateNames(SSL* ssl, std::string_view member);

// Why a handshake failed, for the message that closes the link: OpenSSL's
// reason plus what it means for the relay's options (`parent_name` is
// RelayTlsOptions::parent_name).
std::string ExplainHandshakeFailure(const asio::error_code& ec, SSL* ssl,
                                    const std::string& parent_name);

// True for errors of the TLS layer (OpenSSL's, or a stream cut short).
bool IsTlsError(const asio::error_code& ec);
// What an alert the peer sent, carried by a TLS error, means for this
// endpoint ("" for none).
std::string TlsErrorHint(const asio::error_code& ec);

// The first bytes of a TLS record (a handshake or an alert) where a relay
// frame should start: the peer speaks TLS and this endpoint does not.
bool LooksLikeTls(const uint8_t* p, size_t n);

}  // namespace refit::internal

#endif  // REFIT_TRANSPORT_RELAY_TLS_H_
