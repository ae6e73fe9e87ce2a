// `mpi_allreduce`: a baseline that puts SwitchML's throughput in context. One rank of an
// MPI_Allreduce (MPI_SUM, MPI_COMM_WORLD) on the same verifiable tensor as `switchml worker`,
// measured the same way (bench/baseline.h). Started by mpirun; the transport is mpirun's choice
// (bench/bench.py forces TCP with `--mca btl tcp,self`, or shared memory with vader,self).
// Exit codes: 0 ok, 1 failure, 2 bad flags.
#include <mpi.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "baseline.h"

namespace {

void Check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(text, len));
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // Errors come back as codes and end this rank with a message, instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  switchml::tools::Flags flags(
      "mpi_allreduce",
      "One rank of an MPI_Allreduce (SUM) of the same verifiable tensor `switchml worker`\n"
      "uses; start it with mpirun -np N. Each all-reduce is preceded by MPI_Barrier, timed\n"
      "alone and verified after the timer stops.",
      /*program=*/"");
  switchml::bench::BaselineFlags shared;
  switchml::bench::AddBaselineFlags(&flags, &shared, /*with_rank=*/false);
  switchml::bench::BaselineOptions o;
  o.rank = rank;
  o.workers = size;
  if (int code = switchml::bench::ParseBaselineFlags(argc, argv, "mpi_allreduce", false, &flags,
                                                     shared, &o);
      code >= 0) {
    MPI_Finalize();
    return code;
  }
  if (size > 64) {
    std::fprintf(stderr, "mpi_allreduce: at most 64 ranks, not %d\n", size);
    MPI_Finalize();
    return 2;
  }
  const MPI_Datatype type = o.dtype == switchml::DataType::kFloat32 ? MPI_FLOAT : MPI_INT32_T;
  switchml::bench::Collective c;
  c.barrier = [] { Check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); };
  c.allreduce = [&](const void* in, void* out, size_t count) {
    Check(MPI_Allreduce(in, out, static_cast<int>(count), type, MPI_SUM, MPI_COMM_WORLD),
          "MPI_Allreduce");
  };
  const int rc = switchml::bench::RunBaseline(
      o, "mpi_allreduce (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")", c);
  if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);  // the others would wait for this rank forever
  MPI_Finalize();
  return rc;
}
