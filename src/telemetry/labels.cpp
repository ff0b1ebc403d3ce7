// What telemetry needs without prometheus-cpp: the job's labels.
#include <gpucloud/telemetry/telemetry.hpp>

#include <unistd.h>

#include <cstdlib>

namespace gpucloud::telemetry {

Labels job_labels(const LaunchInfo& launch) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const char* job = std::getenv("SLURM_JOB_ID");
  if (job == nullptr || *job == '\0') job = std::getenv("GPUCLOUD_JOB");
  return {{"rank", std::to_string(launch.rank)},
          {"local_rank", std::to_string(launch.local_rank)},
          {"node", host[0] != '\0' ? host : "unknown"},
          {"job", job != nullptr && *job != '\0' ? job : "local"}};
}

}  // namespace gpucloud::telemetry
