#include "rpc/server_limits.h"

#include <grpcpp/server_builder.h>

namespace ckptd::rpc {

void LimitIdleConnections(grpc::ServerBuilder* builder, absl::Duration handshake_timeout) {
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              static_cast<int>(absl::ToInt64Milliseconds(handshake_timeout)));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20'000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

}  // namespace ckptd::rpc
