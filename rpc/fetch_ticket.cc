#include "rpc/fetch_ticket.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/random.h"

namespace ckptd::rpc {
namespace {

// Each field with its length first: no two (fetcher, job) pairs make the
// same bytes.
void AppendNumber(std::string* out, uint64_t n, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));  // little-endian
}
void Append(std::string* out, absl::string_view field) {
  AppendNumber(out, field.size(), 8);
  out->append(field.data(), field.size());
}

}  // namespace

std::string FetchTicket(absl::string_view key, absl::string_view fetcher, absl::string_view job, uint32_t rank,
                        uint64_t step) {
  std::string message = "ckptd fetch ticket v1";
  Append(&message, fetcher);
  Append(&message, job);
  AppendNumber(&message, rank, 4);
  AppendNumber(&message, step, 8);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), mac, &length) == nullptr ||
      length != kFetchTicketBytes) {
    return std::string();  // never valid (FetchTicketValid wants kFetchTicketBytes)
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

bool FetchTicketValid(absl::string_view ticket, absl::string_view key, absl::string_view fetcher,
                      absl::string_view job, uint32_t rank, uint64_t step) {
  if (key.empty() || ticket.size() != kFetchTicketBytes) return false;
  const std::string expected = FetchTicket(key, fetcher, job, rank, step);
  return expected.size() == kFetchTicketBytes && base::ConstantTimeEquals(ticket, expected);
}

}  // namespace ckptd::rpc
