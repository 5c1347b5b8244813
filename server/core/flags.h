// The server's flags use the parser it shares with flashq-bench (common/flags.h); Triton's spellings
// (--grpc-port=8001, --grpc-port 8001, --grpc_port) and the kBlocks help.
#pragma once

#include "common/flags.h"

namespace flashq::server {

using ::flashq::FlagSet;

}  // namespace flashq::server
