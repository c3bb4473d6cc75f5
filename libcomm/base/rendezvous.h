// Who am I and where do we meet: from comm_config_t and the launcher's environment
// (torchrun, then Open MPI, then Slurm), to a rank, a world size and a Store.
#pragma once

#include <memory>
#include <string>

#include "comm/comm.h"
#include "status.h"
#include "store/store.h"

namespace comm {

struct Identity {
  std::string init_method;   // normalised: "env://", "tcp://H:P", "file:///P", "memory://N"
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;       // -1 when the launcher did not say
  int local_world_size = -1;
  std::string store_host;    // env:// and tcp://
  int store_port = -1;
  std::string path;          // file:// directory, memory:// name
  std::string job_id;        // launcher's job id when known (for default ports, file names)
  // COMM_STORE_EXTERNAL=1 or TORCHELASTIC_USE_AGENT_STORE=True (torchrun's agent serves
  // MASTER_ADDR:MASTER_PORT): rank 0 connects as every rank does, and the store outlives it.
  bool external_store = false;
  bool join = false;  // COMM_JOIN=1: a joiner (docs/design.md, "Growing a communicator"): a client
};

// Validates everything locally: RANK=abc, WORLD_SIZE=0, rank >= world size, a malformed
// init_method or MASTER_PORT are COMM_ERR_INVALID_ARGUMENT naming the variable and value.
// A multi-host job without MASTER_ADDR is an error that says so; a job whose ranks are all
// on one host defaults to 127.0.0.1 and a port derived from the launcher's job id.
Status resolve_identity(const comm_config_t& cfg, Identity* out);

// Connects to (rank 0: serves) the store the identity names. Bounded by timeout_ms.
// tls: COMM_TLS for a TCP store (TcpStoreOptions::tls); null: plaintext.
Status open_store(const Identity& id, int timeout_ms, const std::string& auth_token,
                  std::shared_ptr<Store>* out, std::shared_ptr<tls::Context> tls = nullptr);

}  // namespace comm
