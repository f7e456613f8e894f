// The S3 store's parts that moto cannot exercise: XML parsing of hostile
// responses, URL handling, and retries and error mapping against a canned
// HTTP server that answers with scripted statuses.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

#include "support/status_matchers.h"
#include "support/testing.h"
#include "transport/object_store.h"
#include "transport/s3_xml.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using internal::ParseListObjectsV2;
using internal::XmlUnescape;

std::vector<uint8_t> Bytes(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(S3XmlTest, Unescape) {
  EXPECT_EQ(*XmlUnescape("a&amp;b&lt;c&gt;d&quot;e&apos;f"), "a&b<c>d\"e'f");
  EXPECT_EQ(*XmlUnescape("&#65;&#x42;&#xe9;"), "AB\xc3\xa9");
  EXPECT_EQ(*XmlUnescape("plain"), "plain");
  for (const char* bad :
       {"&", "&amp", "&bogus;", "&#;", "&#x;", "&#0;", "&#xD800;", "&#x110000;",
        "&#12a;", "&aaaaaaaaaaaaaaaaaaaaaaaaaaaaa;"}) {
    EXPECT_THAT(XmlUnescape(bad), StatusIs(StatusCode::kDataLoss)) << bad;
  }
  EXPECT_EQ(internal::XmlEscape("<a&'\">"), "&lt;a&amp;&apos;&quot;&gt;");
}

TEST(S3XmlTest, ListObjectsV2) {
  auto page = ParseListObjectsV2(
      R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
<Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
<IsTruncated>true</IsTruncated>
<Contents><Key>p/a&amp;b</Key><Size>12</Size><ETag>&quot;x&quot;</ETag></Contents>
<Contents><Key>p/c</Key><LastModified>2024</LastModified><Size>18446744073709551615</Size></Contents>
<NextContinuationToken>tok+/=&amp;</NextContinuationToken></ListBucketResult>)");
  ASSERT_OK(page);
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "p/a&b");
  EXPECT_EQ(page->objects[0].size, 12u);
  EXPECT_EQ(page->objects[1].size, 18446744073709551615ull);
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "tok+/=&");

  auto last = ParseListObjectsV2(
      "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_OK(last);
  EXPECT_FALSE(last->truncated);
  EXPECT_TRUE(last->objects.empty());
}

TEST(S3XmlTest, ListObjectsV2RejectsMalformed) {
  for (const char* bad : {
           "",
           "<Error><Code>x</Code></Error>",
           "<ListBucketResult></ListBucketResult>",  // no IsTruncated
           "<ListBucketResult><IsTruncated>maybe</IsTruncated></"
           "ListBucketResult>",
           "<ListBucketResult><IsTruncated>true</IsTruncated></"
           "ListBucketResult>",
           "<ListBucketResult><IsTruncated>false</IsTruncated>"
           "<Contents><Key>k</Key></Contents></ListBucketResult>",
           "<ListBucketResult><IsTruncated>false</IsTruncated>"
           "<Contents><Key>k</Key><Size>-1</Size></Contents></"
           "ListBucketResult>",
           "<ListBucketResult><IsTruncated>false</IsTruncated>"
           "<Contents><Key>k</Key><Size>99999999999999999999</Size></Contents>"
           "</ListBucketResult>",
           "<ListBucketResult><IsTruncated>false</IsTruncated>"
           "<Contents><Key>k&bad;</Key><Size>1</Size></Contents></"
           "ListBucketResult>",
           "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k",
       }) {
    EXPECT_THAT(ParseListObjectsV2(bad), StatusIs(StatusCode::kDataLoss))
        << bad;
  }
}

TEST(S3XmlTest, Error) {
  auto e = internal::ParseS3Error(
      "<Error><Code>NoSuchKey</Code><Message>a &amp; b</Message></Error>");
  EXPECT_EQ(e.code, "NoSuchKey");
  EXPECT_EQ(e.message, "a & b");
  EXPECT_TRUE(internal::ParseS3Error("garbage").code.empty());
}

TEST(S3UrlTest, BadUrlsAndOptions) {
  StoreOptions o;
  o.access_key = "ak";
  o.secret_key = "sk";
  o.endpoint = "http://127.0.0.1:1";
  EXPECT_OK(OpenObjectStore("s3://bucket", o));
  EXPECT_OK(OpenObjectStore("s3://bucket/", o));
  EXPECT_OK(OpenObjectStore("s3://bucket/a/b/", o));
  EXPECT_OK(OpenObjectStore("s3://bucket/a?region=eu-west-1", o));
  for (const char* bad : {"s3://", "s3:///x", "s3://bu/cket/../x", "s3://b c/x",
                          "s3://b/x?colour=red", "s3://b/x?region=EU%20West",
                          "s3://b/x?endpoint=%zz"}) {
    EXPECT_THAT(OpenObjectStore(bad, o), StatusIs(StatusCode::kInvalidArgument))
        << bad;
  }
  StoreOptions no_endpoint = o;
  no_endpoint.endpoint = "";
  auto via_url = OpenObjectStore(
      "s3://b/p?endpoint=http%3A%2F%2F127.0.0.1%3A9&region=us-west-2",
      no_endpoint);
  ASSERT_OK(via_url);
  EXPECT_EQ((*via_url)->Describe(), "s3://b/p at http://127.0.0.1:9");
  StoreOptions bad_endpoint = o;
  bad_endpoint.endpoint = "ftp://x";
  EXPECT_THAT(OpenObjectStore("s3://b", bad_endpoint),
              StatusIs(StatusCode::kInvalidArgument));
}

// A one-connection-at-a-time HTTP/1.1 server that answers each request with
// the next scripted response (then "Connection: close"), and records what
// it received.
class CannedServer {
 public:
  struct Reply {
    int status;
    std::string body;
    std::string headers;  // extra "Name: value\r\n" lines
    bool hang = false;    // never answer (a timeout)
  };
  struct Seen {
    std::string head;  // request line and headers
    std::string body;
  };

  CannedServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(fd_, 16);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }

  ~CannedServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }

  void Script(std::vector<Reply> replies) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : replies) replies_.push_back(std::move(r));
  }

  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

  StoreOptions Options() const {
    StoreOptions o;
    o.endpoint = "http://127.0.0.1:" + std::to_string(port_);
    o.access_key = "AKIDEXAMPLE";
    o.secret_key = "SECRETsecretSECRET";
    o.max_attempts = 3;
    o.backoff_ms = 10;
    o.timeout_ms = 5000;
    return o;
  }

 private:
  void Serve() {
    while (!stop_) {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      Handle(c);
      close(c);
    }
  }

  void Handle(int c) {
    std::string data;
    char buf[65536];
    size_t head_end;
    while ((head_end = data.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = recv(c, buf, sizeof buf, 0);
      if (n <= 0) return;
      data.append(buf, static_cast<size_t>(n));
    }
    std::string head = data.substr(0, head_end);
    std::string body = data.substr(head_end + 4);
    size_t length = 0;
    std::string lower = head;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(ch));
    if (auto p = lower.find("content-length:"); p != std::string::npos) {
      length = std::stoul(lower.substr(p + 15));
    }
    if (lower.find("expect: 100-continue") != std::string::npos) {
      send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL);
    }
    while (body.size() < length) {
      ssize_t n = recv(c, buf, sizeof buf, 0);
      if (n <= 0) return;
      body.append(buf, static_cast<size_t>(n));
    }
    Reply reply{500, "<Error><Code>Unscripted</Code></Error>", "", false};
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back({head, body});
      if (!replies_.empty()) {
        reply = replies_.front();
        replies_.pop_front();
      }
    }
    if (reply.hang) {
      while (!stop_ && recv(c, buf, sizeof buf, 0) > 0) {
      }
      return;
    }
    std::string out =
        "HTTP/1.1 " + std::to_string(reply.status) +
        " Scripted\r\nContent-Length: " + std::to_string(reply.body.size()) +
        "\r\nConnection: close\r\n" + reply.headers + "\r\n" + reply.body;
    send(c, out.data(), out.size(), MSG_NOSIGNAL);
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::deque<Reply> replies_;
  std::vector<Seen> seen_;
};

std::unique_ptr<ObjectStore> Open(const StoreOptions& o) {
  auto s = OpenObjectStore("s3://bkt/pre", o);
  EXPECT_OK(s);
  return std::move(*s);
}

TEST(S3RetryTest, RetriesServerErrorsThenSucceeds) {
  CannedServer server;
  server.Script({{503, "<Error><Code>SlowDown</Code></Error>", ""},
                 {500, "", ""},
                 {200, "", ""}});
  auto store = Open(server.Options());
  ASSERT_OK(store->Put("k/v", Bytes("payload")));
  auto seen = server.seen();
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& s : seen) {
    EXPECT_TRUE(s.head.starts_with("PUT /bkt/pre/k/v HTTP/1.1")) << s.head;
    EXPECT_NE(
        s.head.find("Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
        std::string::npos);
    // sha256("payload")
    EXPECT_NE(
        s.head.find(
            "x-amz-content-sha256: "
            "239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5"),
        std::string::npos)
        << s.head;
    EXPECT_EQ(s.head.find("SECRETsecretSECRET"), std::string::npos);
    EXPECT_EQ(s.body, "payload");
  }
}

TEST(S3RetryTest, GivesUpWithUnavailableNamingStoreAndStatus) {
  CannedServer server;
  server.Script({{503, "<Error><Code>SlowDown</Code></Error>", ""},
                 {429, "", ""},
                 {503, "<Error><Code>SlowDown</Code></Error>", ""}});
  StoreOptions o = server.Options();
  o.backoff_ms = 40;
  auto store = Open(o);
  auto start = std::chrono::steady_clock::now();
  auto got = store->Get("k");
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start)
                .count();
  EXPECT_THAT(got, StatusIs(StatusCode::kUnavailable));
  std::string msg(got.status().message());
  EXPECT_NE(msg.find("s3://bkt/pre"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 attempts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HTTP 503 SlowDown"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("SECRET"), std::string::npos) << msg;
  EXPECT_EQ(server.seen().size(), 3u);
  EXPECT_GE(ms, 20 + 40);  // backoffs of [20,40] and [40,80] ms
}

TEST(S3RetryTest, ConnectionErrorsAreRetriedThenUnavailable) {
  int port;
  {
    CannedServer gone;  // take a port, then free it
    port = std::stoi(gone.Options().endpoint.substr(17));
  }
  StoreOptions o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(port);
  o.access_key = "a";
  o.secret_key = "b";
  o.max_attempts = 2;
  o.backoff_ms = 1;
  auto store = OpenObjectStore("s3://bkt", o);
  ASSERT_OK(store);
  Status s = (*store)->Put("k", Bytes("x"));
  EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable));
  EXPECT_NE(s.message().find("curl error"), std::string_view::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("2 attempts"), std::string_view::npos)
      << s.ToString();
}

TEST(S3RetryTest, PerRequestTimeout) {
  CannedServer server;
  server.Script({{0, "", "", true}, {0, "", "", true}});
  StoreOptions o = server.Options();
  o.timeout_ms = 300;
  o.max_attempts = 2;
  auto store = Open(o);
  auto start = std::chrono::steady_clock::now();
  auto got = store->Get("k");
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start)
                .count();
  EXPECT_THAT(got, StatusIs(StatusCode::kUnavailable));
  EXPECT_GE(ms, 550);
  EXPECT_LT(ms, 5000);
}

TEST(S3ErrorTest, StatusMapping) {
  CannedServer server;
  server.Script({
      {403, "<Error><Code>AccessDenied</Code><Message>no</Message></Error>",
       ""},
      {404, "<Error><Code>NoSuchKey</Code></Error>", ""},
      {404, "<Error><Code>NoSuchBucket</Code></Error>", ""},
      {400, "<Error><Code>InvalidRequest</Code></Error>", ""},
      {404, "<Error><Code>NoSuchKey</Code></Error>", ""},  // DELETE absent
      {204, "", ""},                                       // DELETE
  });
  auto store = Open(server.Options());
  Status denied = store->Get("a").status();
  EXPECT_THAT(denied, StatusIs(StatusCode::kPermissionDenied));
  EXPECT_NE(denied.message().find("AccessDenied"), std::string_view::npos);
  EXPECT_THAT(store->Get("a"), StatusIs(StatusCode::kNotFound));
  Status no_bucket = store->Get("a").status();
  EXPECT_THAT(no_bucket, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(no_bucket.message().find("bucket 'bkt' does not exist"),
            std::string_view::npos)
      << no_bucket.ToString();
  EXPECT_THAT(store->Get("a"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_OK(store->Delete("a"));
  EXPECT_OK(store->Delete("a"));
  EXPECT_EQ(server.seen().size(), 6u);  // none of these is retried
}

TEST(S3ConditionalTest, SendsIfNoneMatchAndMaps412) {
  CannedServer server;
  server.Script({{200, "", ""},
                 {412, "<Error><Code>PreconditionFailed</Code></Error>", ""}});
  auto store = Open(server.Options());
  EXPECT_OK(store->PutIfAbsent("d", Bytes("mine")));
  EXPECT_THAT(store->PutIfAbsent("d", Bytes("mine")),
              StatusIs(StatusCode::kAlreadyExists));
  auto seen = server.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0].head.find("If-None-Match: *"), std::string::npos);
  // The header is signed, so a proxy cannot strip it unnoticed.
  EXPECT_NE(seen[0].head.find("if-none-match"), std::string::npos);
}

TEST(S3ConditionalTest, ConflictIsRetried) {
  CannedServer server;
  server.Script(
      {{409, "<Error><Code>ConditionalRequestConflict</Code></Error>", ""},
       {412, "<Error><Code>PreconditionFailed</Code></Error>", ""}});
  auto store = Open(server.Options());
  EXPECT_THAT(store->PutIfAbsent("d", Bytes("mine")),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_EQ(server.seen().size(), 2u);  // 409 is not ambiguous: no read-back
}

TEST(S3ConditionalTest, LostResponseIsResolvedByReadingBack) {
  CannedServer server;
  // Our write landed but its answer was a 500; the retry sees 412; the
  // read-back shows our bytes, so we won.
  server.Script({{500, "", ""},
                 {412, "", ""},
                 {200, "mine", ""},
                 // Same again, but someone else's bytes: we lost.
                 {500, "", ""},
                 {412, "", ""},
                 {200, "theirs", ""}});
  auto store = Open(server.Options());
  EXPECT_OK(store->PutIfAbsent("d", Bytes("mine")));
  EXPECT_THAT(store->PutIfAbsent("d", Bytes("mine")),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_EQ(server.seen().size(), 6u);
}

TEST(S3ListTest, FollowsContinuationTokens) {
  CannedServer server;
  server.Script({
      {200,
       "<ListBucketResult><IsTruncated>true</IsTruncated>"
       "<Contents><Key>pre/v/b</Key><Size>2</Size></Contents>"
       "<Contents><Key>pre/v/bad key</Key><Size>2</Size></Contents>"
       "<NextContinuationToken>t+/=&amp;1</NextContinuationToken>"
       "</ListBucketResult>",
       ""},
      {200,
       "<ListBucketResult><IsTruncated>false</IsTruncated>"
       "<Contents><Key>pre/v/a</Key><Size>1</Size></Contents>"
       "</ListBucketResult>",
       ""},
      {200,
       "<ListBucketResult><IsTruncated>false</IsTruncated>"
       "<Contents><Key>other/x</Key><Size>1</Size></Contents>"
       "</ListBucketResult>",
       ""},
  });
  auto store = Open(server.Options());
  auto listed = store->List("v/");
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "v/a");
  EXPECT_EQ((*listed)[1].key, "v/b");
  auto seen = server.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(
      seen[0].head.starts_with("GET /bkt?list-type=2&prefix=pre%2Fv%2F "))
      << seen[0].head;
  EXPECT_TRUE(seen[1].head.starts_with(
      "GET "
      "/bkt?continuation-token=t%2B%2F%3D%261&list-type=2&prefix=pre%2Fv%2F "))
      << seen[1].head;
  // A listing that strays outside the store's prefix is corrupt.
  EXPECT_THAT(store->List(""), StatusIs(StatusCode::kDataLoss));
}

}  // namespace
}  // namespace refit
