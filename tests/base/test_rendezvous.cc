// Who am I and where do we meet: comm_config_t, then torchrun, Open MPI, Slurm variables.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "rendezvous.h"

using namespace comm;

namespace {

// Clears every launcher variable for the test and puts the originals back afterwards.
class LauncherEnv {
 public:
  LauncherEnv() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      if (v != nullptr) saved_[name] = v;
      unsetenv(name);
    }
  }
  ~LauncherEnv() {
    for (const char* name : kNames) {
      auto it = saved_.find(name);
      if (it != saved_.end())
        setenv(name, it->second.c_str(), 1);
      else
        unsetenv(name);
    }
  }
  LauncherEnv& set(const char* name, const char* value) {
    setenv(name, value, 1);
    return *this;
  }

 private:
  static constexpr const char* kNames[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
      "OMPI_MCA_ess_base_jobid", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NNODES", "SLURM_JOB_ID",
      "SLURM_STEP_ID"};
  std::map<std::string, std::string> saved_;
};

comm_config_t config(const char* init_method = nullptr, int rank = COMM_UNSET, int world_size = COMM_UNSET) {
  comm_config_t cfg = COMM_CONFIG_INIT;
  cfg.init_method = init_method;
  cfg.rank = rank;
  cfg.world_size = world_size;
  return cfg;
}

Identity resolve_ok(const comm_config_t& cfg) {
  Identity id;
  Status st = resolve_identity(cfg, &id);
  INFO(st.message());
  REQUIRE(st.ok());
  return id;
}

Status resolve_err(const comm_config_t& cfg) {
  Identity id;
  return resolve_identity(cfg, &id);
}

}  // namespace

TEST_CASE("rendezvous: a lone process without a launcher is a one-rank job", "[rendezvous]") {
  LauncherEnv env;
  Identity id = resolve_ok(config());
  CHECK(id.init_method == "env://");
  CHECK(id.rank == 0);
  CHECK(id.world_size == 1);
  CHECK(id.local_rank == 0);
  CHECK(id.local_world_size == 1);
  CHECK(id.store_host == "127.0.0.1");
  CHECK(id.store_port == 0);  // nobody else connects: any free port, no clash with other jobs

  // And it really runs: rank 0 serves itself.
  std::shared_ptr<Store> store;
  REQUIRE(open_store(id, 2000, "", &store).ok());
  REQUIRE(store->set("k", "v").ok());
  std::string v;
  REQUIRE(store->get("k", &v, Deadline::after_ms(1000)).ok());
  CHECK(v == "v");

  // Only a world size, or only a rank, with no launcher: which rank we are is unknown.
  Status st = resolve_err(config(nullptr, COMM_UNSET, 4));
  CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK_THAT(st.message(), Catch::Contains("rank"));
  st = resolve_err(config(nullptr, 2, COMM_UNSET));
  CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK_THAT(st.message(), Catch::Contains("world size"));
}

TEST_CASE("rendezvous: malformed launcher values name the variable and the value", "[rendezvous]") {
  SECTION("RANK=abc") {
    LauncherEnv env;
    env.set("RANK", "abc").set("WORLD_SIZE", "2");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("RANK") && Catch::Contains("'abc'"));
  }
  SECTION("WORLD_SIZE=0") {
    LauncherEnv env;
    env.set("RANK", "0").set("WORLD_SIZE", "0");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("WORLD_SIZE=0"));
  }
  SECTION("RANK=4 WORLD_SIZE=4") {
    LauncherEnv env;
    env.set("RANK", "4").set("WORLD_SIZE", "4").set("MASTER_ADDR", "127.0.0.1");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("RANK=4") && Catch::Contains("WORLD_SIZE=4"));
  }
  SECTION("RANK=-1") {
    LauncherEnv env;
    env.set("RANK", "-1").set("WORLD_SIZE", "4");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("RANK=-1"));
  }
  SECTION("RANK without WORLD_SIZE") {
    LauncherEnv env;
    env.set("RANK", "1");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("WORLD_SIZE"));
  }
  SECTION("OMPI_COMM_WORLD_SIZE=x") {
    LauncherEnv env;
    env.set("OMPI_COMM_WORLD_RANK", "0").set("OMPI_COMM_WORLD_SIZE", "x");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("OMPI_COMM_WORLD_SIZE") && Catch::Contains("'x'"));
  }
  SECTION("bad MASTER_PORT") {
    for (const char* bad : {"abc", "0", "65536", "-3", "12ab"}) {
      LauncherEnv env;
      env.set("RANK", "0").set("WORLD_SIZE", "2").set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", bad);
      Status st = resolve_err(config());
      INFO(bad);
      CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
      CHECK_THAT(st.message(), Catch::Contains("MASTER_PORT") && Catch::Contains(bad));
    }
  }
  SECTION("comm_config_t fields") {
    LauncherEnv env;
    Status st = resolve_err(config(nullptr, 3, 3));
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("comm_config_t.rank=3") && Catch::Contains("comm_config_t.world_size=3"));
    st = resolve_err(config(nullptr, -7, 3));
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("-7"));
    st = resolve_err(config(nullptr, 0, 0));
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("world_size"));
  }
}

TEST_CASE("rendezvous: torchrun's variables", "[rendezvous]") {
  LauncherEnv env;
  env.set("RANK", "5").set("WORLD_SIZE", "8").set("LOCAL_RANK", "1").set("LOCAL_WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "trainer-0.example").set("MASTER_PORT", "29511").set("TORCHELASTIC_RUN_ID", "run-42");
  // Slurm variables around torchrun (srun torchrun ...) do not override torchrun's.
  env.set("SLURM_PROCID", "1").set("SLURM_NTASKS", "2").set("SLURM_NNODES", "2");
  Identity id = resolve_ok(config());
  CHECK(id.init_method == "env://");
  CHECK(id.rank == 5);
  CHECK(id.world_size == 8);
  CHECK(id.local_rank == 1);
  CHECK(id.local_world_size == 4);
  CHECK(id.store_host == "trainer-0.example");
  CHECK(id.store_port == 29511);
  CHECK(id.job_id == "run-42");

  SECTION("MASTER_ADDR without MASTER_PORT: torchrun's default 29500") {
    unsetenv("MASTER_PORT");
    CHECK(resolve_ok(config()).store_port == 29500);
  }
  SECTION("comm_config_t fields win over the environment") {
    env.set("RANK", "abc");  // not read: the config gives the rank
    Identity mine = resolve_ok(config(nullptr, 2, 8));
    CHECK(mine.rank == 2);
    CHECK(mine.world_size == 8);
    CHECK(mine.local_world_size == 4);
  }
}

TEST_CASE("rendezvous: Open MPI and Slurm when torchrun's variables are absent", "[rendezvous]") {
  SECTION("Open MPI") {
    LauncherEnv env;
    env.set("OMPI_COMM_WORLD_RANK", "2").set("OMPI_COMM_WORLD_SIZE", "3");
    env.set("OMPI_COMM_WORLD_LOCAL_RANK", "2").set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
    env.set("OMPI_MCA_ess_base_jobid", "3735879680");
    // Slurm also set (mpirun inside an allocation): Open MPI's variables come first.
    env.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "1");
    Identity id = resolve_ok(config());
    CHECK(id.rank == 2);
    CHECK(id.world_size == 3);
    CHECK(id.local_rank == 2);
    CHECK(id.local_world_size == 3);
    CHECK(id.job_id == "3735879680");
  }
  SECTION("Slurm") {
    LauncherEnv env;
    env.set("SLURM_PROCID", "3").set("SLURM_NTASKS", "4").set("SLURM_LOCALID", "1").set("SLURM_NNODES", "2");
    env.set("SLURM_JOB_ID", "98765").set("MASTER_ADDR", "node-17");
    Identity id = resolve_ok(config());
    CHECK(id.rank == 3);
    CHECK(id.world_size == 4);
    CHECK(id.local_rank == 1);
    CHECK(id.local_world_size == -1);  // Slurm does not say how many ranks each host runs
    CHECK(id.store_host == "node-17");
    CHECK(id.store_port == 29500);
    CHECK(id.job_id == "98765");
  }
}

TEST_CASE("rendezvous: a one-host job without MASTER_ADDR meets on 127.0.0.1, port from the job id",
          "[rendezvous]") {
  auto port_for = [](const char* size_var, const char* local_var, const char* job_var, const char* job) {
    LauncherEnv env;
    if (std::string(size_var) == "SLURM_NTASKS") {
      env.set("SLURM_PROCID", "1").set("SLURM_NTASKS", "2").set("SLURM_NNODES", "1");
    } else {
      env.set(size_var, "2").set(local_var, "2");
      env.set(std::string(size_var) == "WORLD_SIZE" ? "RANK" : "OMPI_COMM_WORLD_RANK", "1");
    }
    if (job != nullptr) env.set(job_var, job);
    Identity id = resolve_ok(config());
    CHECK(id.store_host == "127.0.0.1");
    CHECK(id.local_world_size == 2);
    return id.store_port;
  };
  int torch_a = port_for("WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "job-a");
  int torch_b = port_for("WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "job-b");
  int ompi = port_for("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid", "12345");
  int slurm = port_for("SLURM_NTASKS", nullptr, "SLURM_JOB_ID", "4242");
  for (int p : {torch_a, torch_b, ompi, slurm}) {
    CHECK(p >= 20000);
    CHECK(p < 60000);
  }
  CHECK(torch_a == port_for("WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "job-a"));  // every rank agrees
  CHECK(torch_a != torch_b);  // two jobs on one host do not collide
  CHECK(port_for("WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", nullptr) == 29500);

  SECTION("MASTER_PORT alone is honoured") {
    LauncherEnv env;
    env.set("RANK", "0").set("WORLD_SIZE", "2").set("LOCAL_WORLD_SIZE", "2").set("MASTER_PORT", "31000");
    Identity id = resolve_ok(config());
    CHECK(id.store_host == "127.0.0.1");
    CHECK(id.store_port == 31000);
  }
  SECTION("threads as ranks (memory://) are on one host") {
    LauncherEnv env;
    Identity id = resolve_ok(config("memory://rdv-test", 1, 3));
    CHECK(id.local_rank == 1);
    CHECK(id.local_world_size == 3);
    CHECK(id.path == "rdv-test");
  }
}

TEST_CASE("rendezvous: ranks on several hosts need MASTER_ADDR", "[rendezvous]") {
  SECTION("torchrun, 2 of 4 ranks on this host") {
    LauncherEnv env;
    env.set("RANK", "0").set("WORLD_SIZE", "4").set("LOCAL_WORLD_SIZE", "2");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("MASTER_ADDR") && Catch::Contains("MASTER_PORT") &&
                                 Catch::Contains("across hosts"));
  }
  SECTION("Slurm on two nodes") {
    LauncherEnv env;
    env.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "2").set("SLURM_NNODES", "2").set("SLURM_JOB_ID", "7");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("MASTER_ADDR"));
  }
  SECTION("the layout is unknown") {
    LauncherEnv env;
    env.set("RANK", "0").set("WORLD_SIZE", "2");
    Status st = resolve_err(config());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("MASTER_ADDR"));
  }
}

TEST_CASE("rendezvous: init_method forms", "[rendezvous]") {
  LauncherEnv env;
  SECTION("tcp://HOST:PORT") {
    Identity id = resolve_ok(config("tcp://127.0.0.1:29501", 1, 2));
    CHECK(id.init_method == "tcp://127.0.0.1:29501");
    CHECK(id.store_host == "127.0.0.1");
    CHECK(id.store_port == 29501);
    CHECK(id.rank == 1);
  }
  SECTION("tcp:// with an IPv6 address") {
    Identity id = resolve_ok(config("tcp://[::1]:29500", 0, 2));
    CHECK(id.init_method == "tcp://[::1]:29500");
    CHECK(id.store_host == "::1");
    CHECK(id.store_port == 29500);
    id = resolve_ok(config("tcp://[fe80::1%eth0]:1234", 0, 2));
    CHECK(id.store_host == "fe80::1%eth0");
  }
  SECTION("tcp:// with a host name, no MASTER_ADDR needed across hosts") {
    Identity id = resolve_ok(config("tcp://trainer-0:4000", 3, 16));
    CHECK(id.store_host == "trainer-0");
    CHECK(id.store_port == 4000);
  }
  SECTION("malformed tcp://") {
    for (const char* bad : {"tcp://127.0.0.1", "tcp://127.0.0.1:", "tcp://:29500", "tcp://h:0", "tcp://h:65536",
                            "tcp://h:29x", "tcp://::1:29500", "tcp://[::1]29500", "tcp://[::1"}) {
      INFO(bad);
      Status st = resolve_err(config(bad, 0, 2));
      CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
      CHECK_THAT(st.message(), Catch::Contains(bad));
    }
  }
  SECTION("file:// and memory://") {
    Identity id = resolve_ok(config("file:///shared/job/rdv", 0, 2));
    CHECK(id.path == "/shared/job/rdv");
    CHECK(id.init_method == "file:///shared/job/rdv");
    Status st = resolve_err(config("file://relative/dir", 0, 2));
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("absolute"));
    st = resolve_err(config("memory://", 0, 2));
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
  }
  SECTION("an unknown scheme lists the supported ones") {
    for (const char* bad : {"udp://h:1", "nccl://x", "127.0.0.1:29500", "", "ENV://"}) {
      INFO(bad);
      Status st = resolve_err(config(bad, 0, 2));
      CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
      CHECK_THAT(st.message(), Catch::Contains(std::string("'") + bad + "'"));
      CHECK_THAT(st.message(), Catch::Contains("env://") && Catch::Contains("tcp://HOST:PORT") &&
                                   Catch::Contains("file:///") && Catch::Contains("memory://"));
    }
  }
}

TEST_CASE("rendezvous: open_store connects the ranks an identity names", "[rendezvous]") {
  LauncherEnv env;
  SECTION("tcp://: rank 1 reaches rank 0's store; a wrong token is refused") {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.is_server = true;
    o.auth_token = "job-secret";
    std::shared_ptr<Store> rank0;
    REQUIRE(make_tcp_store(o, &rank0).ok());
    std::string url = "tcp://127.0.0.1:" + std::to_string(tcp_store_port(*rank0));
    Identity id = resolve_ok(config(url.c_str(), 1, 2));
    std::shared_ptr<Store> rank1;
    Status st = open_store(id, 3000, "job-secret", &rank1);
    REQUIRE(st.message() == "");
    REQUIRE(rank1->set("from-1", "hello").ok());
    std::string v;
    REQUIRE(rank0->get("from-1", &v, Deadline::after_ms(2000)).ok());
    CHECK(v == "hello");

    std::shared_ptr<Store> intruder;
    st = open_store(id, 3000, "guess", &intruder);
    CHECK(st.code() == COMM_ERR_INVALID_USAGE);
    CHECK_THAT(st.message(), Catch::Contains("rank 1") && Catch::Contains("COMM_AUTH_TOKEN"));
  }
  SECTION("env://: ranks as threads, rank 0 serves on MASTER_ADDR:MASTER_PORT") {
    // One rank to find a free port, then two ranks on it.
    std::shared_ptr<Store> probe;
    Identity lone = resolve_ok(config());
    REQUIRE(open_store(lone, 2000, "", &probe).ok());
    int port = tcp_store_port(*probe);
    probe.reset();
    env.set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", std::to_string(port).c_str());
    Identity id0 = resolve_ok(config(nullptr, 0, 2));
    Identity id1 = resolve_ok(config(nullptr, 1, 2));
    std::shared_ptr<Store> s0, s1;
    Status st1;
    std::thread r1([&] { st1 = open_store(id1, 5000, "", &s1); });  // may start before rank 0 listens
    Status st0 = open_store(id0, 5000, "", &s0);
    r1.join();
    REQUIRE(st0.message() == "");
    REQUIRE(st1.message() == "");
    int64_t n = 0;
    REQUIRE(s1->add("arrived", 1, &n).ok());
    REQUIRE(s0->add("arrived", 1, &n).ok());
    CHECK(n == 2);
  }
  SECTION("file:// and memory://") {
    char name[] = "/tmp/libcomm_rdv_XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    std::string url = std::string("file://") + name + "/store";
    Identity id = resolve_ok(config(url.c_str(), 0, 2));
    std::shared_ptr<Store> a, b;
    REQUIRE(open_store(id, 1000, "", &a).ok());
    REQUIRE(open_store(id, 1000, "", &b).ok());
    REQUIRE(a->set("k", "file").ok());
    std::string v;
    REQUIRE(b->get("k", &v, Deadline::after_ms(1000)).ok());
    CHECK(v == "file");
    std::filesystem::remove_all(name);

    Identity m = resolve_ok(config("memory://rdv-open", 0, 2));
    REQUIRE(open_store(m, 1000, "", &a).ok());
    CHECK(a == memory_store("rdv-open"));
  }
}
