#include "io/load_budget.h"

#include "core/error.h"
#include "core/human_units.h"

namespace dp::io {
namespace {
thread_local LoadBudget* installed = nullptr;
}  // namespace

LoadBudget::LoadBudget(uint64_t early_bytes, std::string awaited, std::chrono::milliseconds lift_timeout)
    : early_bytes_(early_bytes), awaited_(std::move(awaited)), lift_timeout_(lift_timeout) {
  DP_CHECK(lift_timeout_.count() > 0, "a load budget needs a positive timeout, got ", lift_timeout_.count(), " ms");
}

uint64_t LoadBudget::room() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lifted_ ? kUnlimited : early_bytes_ - taken_;
}

void LoadBudget::take(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lifted_) return;
  DP_CHECK(bytes <= early_bytes_ - taken_, "a load asked for ", human_size(static_cast<double>(bytes)),
           " of device memory with ", human_size(static_cast<double>(early_bytes_ - taken_)), " left before ",
           awaited_);
  taken_ += bytes;
}

double LoadBudget::wait_for_lift() const {
  const auto started = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  ++waiters_;
  const bool done = lifted_signal_.wait_for(lock, lift_timeout_, [this] { return lifted_; });
  --waiters_;
  DP_CHECK(done, "loading waited ", lift_timeout_.count() / 1000.0, " s for ", awaited_, " and gave up (",
           human_size(static_cast<double>(taken_)), " of ", human_size(static_cast<double>(early_bytes_)),
           " loaded early)");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void LoadBudget::lift() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lifted_ = true;
  }
  lifted_signal_.notify_all();
}

bool LoadBudget::lifted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lifted_;
}

int LoadBudget::waiters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiters_;
}

uint64_t LoadBudget::taken_early() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return taken_;
}

ScopedLoadBudget::ScopedLoadBudget(LoadBudget* budget) : previous_(installed) { installed = budget; }
ScopedLoadBudget::~ScopedLoadBudget() { installed = previous_; }

LoadBudget* current_load_budget() { return installed; }

}  // namespace dp::io
