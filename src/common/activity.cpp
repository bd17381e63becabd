#include "fsdp/common/activity.h"

#include <vector>

namespace fsdp {
namespace {
thread_local Activity t_activity;
thread_local int t_exempt_depth = 0;
thread_local std::vector<Activity> t_saved;
}  // namespace

Activity current_activity() { return t_activity; }

Activity exchange_activity(Activity next) {
  const Activity previous = t_activity;
  t_activity = next;
  return previous;
}

void push_activity(Activity next) { t_saved.push_back(exchange_activity(next)); }

void pop_activity() {
  if (t_saved.empty()) return;
  t_activity = t_saved.back();
  t_saved.pop_back();
}

BudgetExemptScope::BudgetExemptScope() { ++t_exempt_depth; }
BudgetExemptScope::~BudgetExemptScope() { --t_exempt_depth; }
bool budget_exempt() { return t_exempt_depth > 0; }

}  // namespace fsdp
