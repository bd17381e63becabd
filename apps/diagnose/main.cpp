// fsdp-diagnose DIR: says who is where from the flight-recorder dumps a job's ranks wrote
// (FSDP_FLIGHT_RECORDER_DIR, or fsdp-train's default beside --metrics) after a collective timed out
// or failed. Exit 0 with the paragraph; 1 when every dump there is unreadable; 2 for a bad argument.
#include <iostream>

#include "diagnose/diagnosis.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cerr << "usage: fsdp-diagnose DIR\n  DIR: the folder of rank-RRRRR.json flight-recorder dumps\n";
    return argc == 2 ? 0 : 2;
  }
  try {
    std::vector<std::string> problems;
    auto dumps = apps::diagnose::read_dumps(argv[1], &problems);
    for (const auto& p : problems) std::cerr << "fsdp-diagnose: skipped " << p << "\n";
    if (dumps.empty() && !problems.empty()) {
      std::cerr << "fsdp-diagnose: error: no readable flight-recorder dump in '" << argv[1] << "' ("
                << problems.size() << " unreadable)" << std::endl;
      return 1;
    }
    std::cout << apps::diagnose::diagnose(dumps) << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-diagnose: error: " << e.what() << std::endl;
    return 2;
  }
}
