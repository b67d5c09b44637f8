#include "svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace attn::cli::svg {
namespace {

constexpr const char* kFont = "font-family=\"Helvetica, Arial, 'DejaVu Sans', sans-serif\"";

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string default_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// One axis mapped onto [pix_lo, pix_hi] (pixels may run backwards, as the y axis does).
struct Scale {
  const Axis* axis;
  double lo, hi;  // in axis units (log-transformed when the axis is log)
  double pix_lo, pix_hi;

  double t(double v) const { return axis->log ? std::log(v) / std::log(axis->base) : v; }
  double pix(double v) const { return pix_lo + (t(v) - lo) / (hi - lo) * (pix_hi - pix_lo); }
  bool usable(double v) const { return std::isfinite(v) && (!axis->log || v > 0); }
};

// The data range of one axis, widened to whole powers of the base on a log axis so that there is
// always at least a tick at each end; linear axes get 5% padding.
void fit(Scale& s, double vmin, double vmax) {
  if (s.axis->log) {
    s.lo = std::floor(s.t(vmin) + 1e-9);
    s.hi = std::ceil(s.t(vmax) - 1e-9);
    if (s.hi <= s.lo) s.hi = s.lo + 1;
  } else {
    const double pad = vmax > vmin ? 0.05 * (vmax - vmin) : std::max(1.0, std::abs(vmin) * 0.1);
    s.lo = vmin - pad;
    s.hi = vmax + pad;
  }
}

// Major tick values: powers of the base (every k-th when that would be crowded), or ~6 round values.
std::vector<double> ticks(const Scale& s, int max_ticks) {
  std::vector<double> out;
  if (s.axis->log) {
    const int first = static_cast<int>(std::lround(s.lo)), last = static_cast<int>(std::lround(s.hi));
    const int step = std::max(1, (last - first + max_ticks - 1) / max_ticks);
    for (int e = first; e <= last; e += step) out.push_back(std::pow(s.axis->base, e));
  } else {
    const double raw = (s.hi - s.lo) / 6;
    const double mag = std::pow(10, std::floor(std::log10(raw)));
    const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
    for (double v = std::ceil(s.lo / step) * step; v <= s.hi + 1e-9 * step; v += step) out.push_back(v);
  }
  return out;
}

std::string label(const Axis& a, double v) { return a.format ? a.format(v) : default_label(v); }

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render(const Plot& plot) {
  // Plot area inside the canvas: room on the left for y tick labels, below for x ticks and title.
  // The legend is a row between the title and the plot, so it never hides data or marker labels.
  const double left = 86, right = plot.width - 40.0, top = 66, bottom = plot.height - 62.0;

  Scale xs{&plot.x, 0, 1, left, right}, ys{&plot.y, 0, 1, bottom, top};
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const Series& s : plot.series)
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!xs.usable(s.x[i]) || !ys.usable(s.y[i])) continue;
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      ymin = std::min(ymin, s.y[i]);
      ymax = std::max(ymax, s.y[i]);
    }
  if (!(xmin <= xmax)) throw std::invalid_argument("svg::render: no plottable points");
  // The x axis spans the data (a sweep's from..to) plus a little room for the end dots; the y axis
  // gets whole decades.
  if (plot.x.log) {
    xs.lo = xmax > xmin ? xs.t(xmin) : xs.t(xmin) - 0.5;  // a single point sits in the middle
    xs.hi = xmax > xmin ? xs.t(xmax) : xs.t(xmin) + 0.5;
    const double pad = 0.025 * (xs.hi - xs.lo);
    xs.lo -= pad;
    xs.hi += pad;
  } else {
    fit(xs, xmin, xmax);
  }
  fit(ys, ymin, ymax);

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << plot.width << "\" height=\"" << plot.height
    << "\" viewBox=\"0 0 " << plot.width << ' ' << plot.height << "\" " << kFont << " font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  o << "<text x=\"" << fmt(plot.width / 2.0) << "\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" "
    << "font-weight=\"bold\" fill=\"#222\">" << xml_escape(plot.title) << "</text>\n";

  // Grid and tick labels. Ticks on the x axis that fall outside the data range are dropped.
  o << "<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  std::ostringstream labels;
  std::vector<double> x_ticks;
  for (double v : ticks(xs, 10))
    if (xs.pix(v) >= left - 0.5 && xs.pix(v) <= right + 0.5) x_ticks.push_back(v);
  // A narrow range may hold no power of the base, or one: label the ends of the data instead.
  if (x_ticks.size() < 2) {
    x_ticks = {xmin};
    if (xmax > xmin) x_ticks.push_back(xmax);
  }
  for (double v : x_ticks) {
    const double px = xs.pix(v);
    o << "<line x1=\"" << fmt(px) << "\" y1=\"" << fmt(top) << "\" x2=\"" << fmt(px) << "\" y2=\"" << fmt(bottom)
      << "\"/>\n";
    labels << "<text x=\"" << fmt(px) << "\" y=\"" << fmt(bottom + 18) << "\" text-anchor=\"middle\">"
           << xml_escape(label(plot.x, v)) << "</text>\n";
  }
  for (double v : ticks(ys, 8)) {
    const double py = ys.pix(v);
    o << "<line x1=\"" << fmt(left) << "\" y1=\"" << fmt(py) << "\" x2=\"" << fmt(right) << "\" y2=\"" << fmt(py)
      << "\"/>\n";
    labels << "<text x=\"" << fmt(left - 8) << "\" y=\"" << fmt(py + 4) << "\" text-anchor=\"end\">"
           << xml_escape(label(plot.y, v)) << "</text>\n";
  }
  o << "</g>\n<g fill=\"#444\">\n" << labels.str() << "</g>\n";
  o << "<rect x=\"" << fmt(left) << "\" y=\"" << fmt(top) << "\" width=\"" << fmt(right - left) << "\" height=\""
    << fmt(bottom - top) << "\" fill=\"none\" stroke=\"#888\"/>\n";

  // Axis titles.
  o << "<text x=\"" << fmt((left + right) / 2) << "\" y=\"" << fmt(plot.height - 16.0)
    << "\" text-anchor=\"middle\" font-size=\"13\" fill=\"#222\">" << xml_escape(plot.x.title) << "</text>\n";
  o << "<text transform=\"translate(18," << fmt((top + bottom) / 2) << ") rotate(-90)\" "
    << "text-anchor=\"middle\" font-size=\"13\" fill=\"#222\">" << xml_escape(plot.y.title) << "</text>\n";

  // Markers under the data, so the lines stay readable where they meet.
  for (const Marker& m : plot.markers) {
    if (!xs.usable(m.x)) continue;
    const double px = xs.pix(m.x);
    if (px < left || px > right) continue;
    o << "<line x1=\"" << fmt(px) << "\" y1=\"" << fmt(top) << "\" x2=\"" << fmt(px) << "\" y2=\"" << fmt(bottom)
      << "\" stroke=\"" << m.color << "\" stroke-width=\"1.2\" stroke-dasharray=\"5,4\"/>\n";
  }

  // Series, clipped to the plot area.
  o << "<clipPath id=\"area\"><rect x=\"" << fmt(left) << "\" y=\"" << fmt(top) << "\" width=\"" << fmt(right - left)
    << "\" height=\"" << fmt(bottom - top) << "\"/></clipPath>\n"
    << "<g clip-path=\"url(#area)\" fill=\"none\" stroke-linejoin=\"round\">\n";
  std::vector<std::pair<double, double>> all_points;  // for placing the legend
  for (const Series& s : plot.series) {
    std::ostringstream path, dots;
    bool pen_down = false;
    std::size_t count = 0;
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!xs.usable(s.x[i]) || !ys.usable(s.y[i])) {
        pen_down = false;  // a gap, not a line through an unplottable point
        continue;
      }
      const double px = xs.pix(s.x[i]), py = ys.pix(s.y[i]);
      path << (pen_down ? " L" : " M") << fmt(px) << ' ' << fmt(py);
      pen_down = true;
      dots << "<circle cx=\"" << fmt(px) << "\" cy=\"" << fmt(py) << "\" r=\"2.6\"/>";
      all_points.emplace_back(px, py);
      ++count;
    }
    o << "<path d=\"" << path.str() << "\" stroke=\"" << s.color << "\" stroke-width=\"2.2\""
      << (s.dashed ? " stroke-dasharray=\"7,4\"" : "") << "/>\n";
    if (s.dots && count <= 40) o << "<g fill=\"" << s.color << "\" stroke=\"none\">" << dots.str() << "</g>\n";
  }
  o << "</g>\n";

  // Marker dots and labels above the data. The label sits by the top of its line, on whichever
  // side has room, and successive markers step down so they do not overprint.
  for (std::size_t k = 0; k < plot.markers.size(); ++k) {
    const Marker& m = plot.markers[k];
    if (!xs.usable(m.x)) continue;
    const double px = xs.pix(m.x);
    if (px < left || px > right) continue;
    if (ys.usable(m.y))
      o << "<circle cx=\"" << fmt(px) << "\" cy=\"" << fmt(ys.pix(m.y)) << "\" r=\"4.5\" fill=\"#fff\" "
        << "stroke=\"" << m.color << "\" stroke-width=\"2\"/>\n";
    const bool room_right = px + 7.0 * static_cast<double>(m.label.size()) < right - 6;
    const double ty = top + 16 + 16.0 * static_cast<double>(k);
    o << "<text x=\"" << fmt(room_right ? px + 6 : px - 6) << "\" y=\"" << fmt(ty) << "\" text-anchor=\""
      << (room_right ? "start" : "end") << "\" fill=\"" << m.color << "\" stroke=\"#fff\" "
      << "stroke-width=\"3\" paint-order=\"stroke\">" << xml_escape(m.label) << "</text>\n";
  }

  // Legend: one centred row under the title. Text width is estimated (no font metrics here).
  if (!plot.series.empty()) {
    std::vector<double> widths;
    double total = 0;
    for (const Series& s : plot.series) {
      widths.push_back(34 + 6.6 * static_cast<double>(s.name.size()) + 22);
      total += widths.back();
    }
    double bx = std::max(left, (left + right) / 2 - total / 2);
    const double ly = 47;
    o << "<g>\n";
    for (std::size_t i = 0; i < plot.series.size(); ++i) {
      const Series& s = plot.series[i];
      o << "<line x1=\"" << fmt(bx) << "\" y1=\"" << fmt(ly) << "\" x2=\"" << fmt(bx + 26) << "\" y2=\"" << fmt(ly)
        << "\" stroke=\"" << s.color << "\" stroke-width=\"2.2\"" << (s.dashed ? " stroke-dasharray=\"7,4\"" : "")
        << "/>\n"
        << "<text x=\"" << fmt(bx + 32) << "\" y=\"" << fmt(ly + 4) << "\" fill=\"#222\">" << xml_escape(s.name)
        << "</text>\n";
      bx += widths[i];
    }
    o << "</g>\n";
  }
  o << "</svg>\n";
  return o.str();
}

void write_file(const Plot& plot, const std::string& path) {
  const std::string doc = render(plot);
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write '" + path + "'");
  f << doc;
  if (!f.flush()) throw std::runtime_error("cannot write '" + path + "'");
}

}  // namespace attn::cli::svg
