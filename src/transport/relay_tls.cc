#include "transport/relay_tls.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>

namespace refit::internal {
namespace {

// OpenSSL's reason for an ssl-category error (0 for others).
int TlsReason(const asio::error_code& ec) {
  if (ec.category() != asio::error::get_ssl_category()) return 0;
  return ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
}

// What an alert the peer sent means for us ("" when nothing useful).
std::string TlsAlertHint(int reason) {
  if (reason < SSL_AD_REASON_OFFSET) return "";
  switch (reason - SSL_AD_REASON_OFFSET) {
    case SSL3_AD_UNSUPPORTED_CERTIFICATE:
      return "the peer refused this endpoint's certificate as unsuitable "
             "(an extendedKeyUsage must allow both serverAuth and "
             "clientAuth)";
    case SSL3_AD_BAD_CERTIFICATE:
    case SSL3_AD_CERTIFICATE_REVOKED:
    case SSL3_AD_CERTIFICATE_EXPIRED:
    case SSL3_AD_CERTIFICATE_UNKNOWN:
    case TLS1_AD_UNKNOWN_CA:
    case TLS1_AD_ACCESS_DENIED:
    case TLS13_AD_CERTIFICATE_REQUIRED:
      return "the peer refused this endpoint's certificate (is it from the "
             "peer's CA? does it carry the name the peer expects?)";
    case SSL3_AD_BAD_RECORD_MAC:
      return "the peer received a corrupted TLS record";
    case TLS1_AD_PROTOCOL_VERSION:
      return "the peer does not speak TLS 1.3";
    default:
      return "an alert from the peer";
  }
}

}  // namespace

Result<std::unique_ptr<asio::ssl::context>> MakeRelayTlsContext(
    const RelayTlsOptions& t, const std::string& name) {
  if (t.cert_file.empty() || t.key_file.empty() || t.ca_file.empty()) {
    return InvalidArgumentError(
        "relay " + name +
        ": TLS needs a certificate chain, its private key and a CA file "
        "(cert_file, key_file, ca_file), all three");
  }
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls);
  SSL_CTX* c = ctx->native_handle();
  if (SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) != 1) {
    return InternalError("relay " + name + ": OpenSSL refuses TLS 1.3");
  }
  SSL_CTX_set_num_tickets(c, 0);
  ctx->set_options(asio::ssl::context::default_workarounds);
  auto failed = [&](const std::string& what, const std::string& file,
                    const asio::error_code& ec) {
    return InvalidArgumentError("relay " + name + ": cannot load the TLS " +
                                what + " '" + file + "': " + ec.message());
  };
  asio::error_code ec;
  ctx->use_certificate_chain_file(t.cert_file, ec);
  if (ec) return failed("certificate chain", t.cert_file, ec);
  ctx->use_private_key_file(t.key_file, asio::ssl::context::pem, ec);
  if (ec) return failed("private key", t.key_file, ec);
  if (SSL_CTX_check_private_key(c) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("relay " + name + ": the TLS private key '" +
                                t.key_file +
                                "' does not belong to the "
                                "certificate '" +
                                t.cert_file + "'");
  }
  ctx->load_verify_file(t.ca_file, ec);
  if (ec) return failed("CA file", t.ca_file, ec);
  return ctx;
}

bool RequirePeerName(SSL* ssl, const std::string& peer_name) {
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  asio::error_code not_ip;
  asio::ip::make_address(peer_name, not_ip);
  const int ok = not_ip
                     ? X509_VERIFY_PARAM_set1_host(param, peer_name.c_str(), 0)
                     : X509_VERIFY_PARAM_set1_ip_asc(param, peer_name.c_str());
  if (ok != 1) {
    ERR_clear_error();
    return false;
  }
  return true;
}

bool PeerCertificateNames(SSL* ssl, std::string_view member) {
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr ||
      X509_check_host(cert, member.data(), member.size(),
                      X509_CHECK_FLAG_NO_WILDCARDS, nullptr) != 1) {
    ERR_clear_error();
    return false;
  }
  return true;
}

std::string ExplainHandshakeFailure(const asio::error_code& ec, SSL* ssl,
                                    const std::string& parent_name) {
  std::string why = ec.message();
  const int reason = TlsReason(ec);
  if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
    const long v = SSL_get_verify_result(ssl);
    why += std::string(" (") + X509_verify_cert_error_string(v) + ")";
    switch (v) {
      case X509_V_ERR_HOSTNAME_MISMATCH:
      case X509_V_ERR_IP_ADDRESS_MISMATCH:
        why += ": its certificate does not name '" + parent_name +
               "' (parent_name)";
        break;
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      case X509_V_ERR_CERT_SIGNATURE_FAILURE:
        why += ": its certificate is not from our CA (ca_file)";
        break;
      case X509_V_ERR_INVALID_PURPOSE:
        why +=
            ": its certificate's extendedKeyUsage must allow both "
            "serverAuth and clientAuth";
        break;
      default:
        break;
    }
  } else if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
    why += ": a child must present a certificate from our CA";
  } else if (reason == SSL_R_WRONG_VERSION_NUMBER ||
             reason == SSL_R_HTTP_REQUEST ||
             reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
             reason == SSL_R_RECORD_LENGTH_MISMATCH ||
             reason == SSL_R_UNEXPECTED_RECORD ||
             reason == SSL_R_UNSUPPORTED_PROTOCOL ||
             reason == SSL_R_NO_PROTOCOLS_AVAILABLE) {
    why +=
        ": the peer does not speak TLS 1.3 (is it configured without "
        "relay TLS?)";
  } else if (reason >= SSL_AD_REASON_OFFSET) {
    why += ": " + TlsAlertHint(reason);
  } else if (ec == asio::error::eof ||
             ec == asio::ssl::error::stream_truncated) {
    why =
        "the peer closed the connection during the handshake (does it "
        "use TLS? does it trust our certificate?)";
  }
  ERR_clear_error();
  return why;
}

bool IsTlsError(const asio::error_code& ec) {
  return ec.category() == asio::error::get_ssl_category() ||
         ec == asio::ssl::error::stream_truncated;
}

std::string TlsErrorHint(const asio::error_code& ec) {
  return TlsAlertHint(TlsReason(ec));
}

bool LooksLikeTls(const uint8_t* p, size_t n) {
  return n >= 2 && (p[0] == 0x16 || p[0] == 0x15) && p[1] == 0x03;
}

}  // namespace refit::internal
