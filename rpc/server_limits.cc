#include "rpc/server_limits.h"

#include <grpcpp/server_builder.h>

#include <algorithm>
#include <cstdint>

namespace ckptd::rpc {

void LimitIdleConnections(grpc::ServerBuilder* builder, absl::Duration handshake_timeout) {
  builder->AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(handshake_timeout), 1, 3'600'000)));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 300'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20'000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

}  // namespace ckptd::rpc
