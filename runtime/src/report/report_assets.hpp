// The report page's assets, embedded at build time (cmake/embed_text.cmake):
// uPlot as npm installs it into runtime/report/node_modules, and the page's own
// script and styles from runtime/report/.
#pragma once

#include <string_view>

namespace areal::report::assets {
extern const std::string_view uplot_js;
extern const std::string_view uplot_css;
extern const std::string_view report_js;
extern const std::string_view report_css;
}  // namespace areal::report::assets
