// A tiny, dependency-free SVG line plot: log (or linear) axes, ticks at powers of a base, a legend,
// several named series and labelled vertical markers. Enough for `attn io --sweep --svg` without
// pulling a plotting stack into a C++ tool; the output is a standalone file any browser shows.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace attn::cli::svg {

struct Series {
  std::string name;       // shown in the legend
  std::vector<double> x;  // same length as y; points with a non-positive value on a log axis are skipped
  std::vector<double> y;
  std::string color = "#1f77b4";
  bool dashed = false;
  bool dots = true;  // a small circle at each point (omitted when there are many)
};

// A vertical line at x with a dot at (x, y) (y may be NaN: no dot) and a label.
struct Marker {
  double x = 0;
  double y = 0;
  std::string label;
  std::string color = "#555555";
};

struct Axis {
  std::string title;
  bool log = true;
  double base = 10;  // log axes: major ticks at powers of this (2 or 10)
  // Tick label text for a value; empty = "%g".
  std::function<std::string(double)> format;
};

struct Plot {
  std::string title;
  Axis x, y;
  std::vector<Series> series;
  std::vector<Marker> markers;
  int width = 720;
  int height = 440;
};

// The SVG document. Throws std::invalid_argument when there is nothing to draw.
std::string render(const Plot& plot);

// render() into `path`; throws std::runtime_error naming the path when it cannot be written.
void write_file(const Plot& plot, const std::string& path);

// Escapes &, <, >, " for SVG text and attributes.
std::string xml_escape(const std::string& s);

}  // namespace attn::cli::svg
