// Writes diffpipe's tiny pipeline and plans its transformer over two devices, through an installed diffpipe.
#include <iostream>

#include "core/error.h"
#include "fixtures/tiny_pipeline.h"
#include "placement/plan.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: diffpipe_consumer MODEL_DIR\n";
    return 2;
  }
  try {
    dp::fixtures::write_tiny_pipeline(argv[1], {});
    dp::placement::PlanRequest request;
    request.model_dir = argv[1];
    request.device_map = "balanced";
    request.world_size = 2;
    const auto plan = dp::placement::make_plan(request);
    std::cout << plan.dump(2).substr(0, 400) << "\n";
    return plan.contains("hf_device_map") || plan.dump().find("hf_device_map") != std::string::npos ? 0 : 1;
  } catch (const dp::Error& e) {
    std::cerr << "diffpipe_consumer: " << e.what() << "\n";
    return 1;
  }
}
