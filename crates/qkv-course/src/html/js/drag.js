  /* ---------- drag-query widgets ---------- */

  function setupDrag(root) {
    var data = json(root, "script[data-qkv-data]");
    var svg = root.querySelector("svg[data-qkv-plane]");
    var handle = root.querySelector("[data-qkv-handle]");
    if (!data || !svg || !handle) return;
    var plane = data.plane;
    var unit = (plane.size - 2 * plane.pad) / (2 * plane.extent);
    var digits = data.digits;
    var byAttr = function (attr, label) {
      return root.querySelector("[" + attr + '="' + CSS.escape(label) + '"]');
    };
    var parts = data.labels.map(function (label) {
      return {
        line: byAttr("data-qkv-line", label),
        bar: byAttr("data-qkv-bar", label),
        dot: byAttr("data-qkv-readout", "dot:" + label),
        score: byAttr("data-qkv-readout", "score:" + label),
        weight: byAttr("data-qkv-readout", "weight:" + label),
      };
    });
    var outputs = root.querySelectorAll('[data-qkv-readout^="output"]');
    var arrow = root.querySelector("[data-qkv-query-arrow]");
    var start = root.querySelector("[data-qkv-start]");
    var goal = root.querySelector("[data-qkv-goal]");
    var goalText = root.querySelector("[data-qkv-goal-text]");
    var reset = root.querySelector("[data-qkv-reset]");
    // What the build wrote at the declared query: shown again, byte for byte, after a reset.
    var written = Array.prototype.map.call(root.querySelectorAll("[data-qkv-readout], [data-qkv-start]"), function (n) {
      return [n, n.innerHTML];
    });
    var goalWritten = goalText ? goalText.textContent : "";
    var q = data.query.slice();
    var queryLabel = root.querySelector("[data-qkv-query-label]");
    var keyBoxes = null;

    function toScreen(x, y) {
      return [plane.pad + (x + plane.extent) * unit, plane.size - plane.pad - (y + plane.extent) * unit];
    }

    /* The engine's reference for one query, in the same order of operations
     * (qkv::reference::trace_query): dot products, times the scale, masked keys at -inf, subtract
     * the max, exponentiate, divide by the sum, weight the values. */
    function attend(query) {
      var dots = data.keys.map(function (k) {
        var s = 0;
        for (var i = 0; i < k.length; i++) s += query[i] * k[i];
        return s;
      });
      var scores = dots.map(function (d, j) {
        return data.kept[j] ? d * data.scale : -Infinity;
      });
      var max = -Infinity;
      scores.forEach(function (s) {
        if (isFinite(s) && s > max) max = s;
      });
      var exps = scores.map(function (s, j) {
        return data.kept[j] ? Math.exp(s - max) : 0;
      });
      var sum = 0;
      exps.forEach(function (e) {
        sum += e;
      });
      var weights = exps.map(function (e) {
        return sum > 0 ? e / sum : 0;
      });
      var output = data.values[0].map(function (_, c) {
        var o = 0;
        weights.forEach(function (a, j) {
          o += a * data.values[j][c];
        });
        return o;
      });
      return { dots: dots, scores: scores, weights: weights, output: output };
    }

    /* Spots for the "q" beside the handle (its baseline, in the handle's units), in order of
     * preference: the first that keeps clear of every key's label, else the clearest. */
    var SPOTS = [[13, 20], [-21, 20], [13, -9], [-21, -9]];
    function placeQueryLabel(p) {
      if (!queryLabel) return;
      if (!keyBoxes) {
        // Measured once the plane is shown; the labels never move.
        keyBoxes = Array.prototype.map.call(svg.querySelectorAll(".key-label"), function (t) {
          return t.getBBox();
        });
      }
      var best = SPOTS[0];
      var clearest = -1;
      SPOTS.some(function (s) {
        var x = p[0] + s[0] + 4; // the middle of the glyph, about 8 by 12 units
        var y = p[1] + s[1] - 6;
        var gap = Infinity;
        keyBoxes.forEach(function (b) {
          var dx = Math.max(b.x - x, 0, x - b.x - b.width);
          var dy = Math.max(b.y - y, 0, y - b.y - b.height);
          gap = Math.min(gap, Math.sqrt(dx * dx + dy * dy));
        });
        if (gap > clearest) {
          clearest = gap;
          best = s;
        }
        return gap >= 10;
      });
      queryLabel.setAttribute("x", String(best[0]));
      queryLabel.setAttribute("y", String(best[1]));
    }

    function largest(weights, g) {
      return weights.every(function (w, j) {
        return j === g || w < weights[g];
      });
    }

    function render() {
      var r = attend(q);
      var p = toScreen(q[0], q[1]);
      var atStart = q[0] === data.query[0] && q[1] === data.query[1];
      root.setAttribute("data-qkv-query", q[0] + "," + q[1]);
      handle.setAttribute("transform", "translate(" + p[0].toFixed(1) + " " + p[1].toFixed(1) + ")");
      placeQueryLabel(p);
      // One slider for the plane: its value is q's x (Left and Right), its text both coordinates.
      handle.setAttribute("aria-valuenow", String(q[0]));
      handle.setAttribute("aria-valuetext", "q = (" + fixed(q[0], 2) + ", " + fixed(q[1], 2) + ")");
      if (arrow) {
        arrow.setAttribute("x2", p[0].toFixed(1));
        arrow.setAttribute("y2", p[1].toFixed(1));
      }
      parts.forEach(function (part, j) {
        var w = r.weights[j];
        if (part.line) {
          part.line.setAttribute("x1", p[0].toFixed(1));
          part.line.setAttribute("y1", p[1].toFixed(1));
          part.line.setAttribute("stroke-width", data.kept[j] ? (1 + 9 * w).toFixed(2) : "0");
        }
        if (part.bar) part.bar.style.width = (100 * w).toFixed(2) + "%";
        if (part.dot) part.dot.textContent = fixed(r.dots[j], digits);
        if (part.score) part.score.textContent = data.kept[j] ? fixed(r.scores[j], digits) : "masked";
        if (part.weight) part.weight.textContent = fixed(w, digits);
      });
      outputs.forEach(function (node) {
        var name = node.getAttribute("data-qkv-readout");
        var c = name === "output" ? 0 : Number(name.split(":")[1]) - 1;
        node.textContent = fixed(r.output[c], digits);
      });
      if (start) {
        start.innerHTML = "Now <i>q</i> = (" + fixed(q[0], 2) + ", " + fixed(q[1], 2) + "):";
      }
      if (atStart) {
        written.forEach(function (w) {
          w[0].innerHTML = w[1];
        });
      }
      if (goal && data.goal) {
        var g = data.labels.indexOf(data.goal.largest);
        // The check follows the query: it shows while the goal holds, so it never claims a
        // state the plane no longer shows.
        var met = largest(r.weights, g);
        goal.setAttribute("data-qkv-met", met ? "true" : "false");
        if (goalText) {
          goalText.textContent = met ? "Done: “" + data.goal.largest + "” now has the largest weight." : goalWritten;
        }
      }
      announceSoon();
    }

    /* What the readouts and the goal show, said through the polite live region once the query
     * has rested for a moment: a drag or a held arrow key would otherwise queue a sentence per
     * step. The text is read back from the readouts, so it says exactly what the page shows. */
    var announce = root.querySelector("[data-qkv-announce]");
    var announceTimer = null;
    function announceSoon() {
      if (!announce) return;
      clearTimeout(announceTimer);
      announceTimer = setTimeout(function () {
        var said = [handle.getAttribute("aria-valuetext") + "."];
        said.push("Weights: " + parts.map(function (part, j) {
          return data.labels[j] + " " + (part.weight ? part.weight.textContent : "");
        }).join(", ") + ".");
        said.push("Output: " + Array.prototype.map.call(outputs, function (n) {
          return n.textContent;
        }).join(", ") + ".");
        if (goalText) said.push(goalText.textContent);
        announce.textContent = said.join(" ");
      }, 600);
    }

    function clamp(x) {
      return Math.max(-plane.extent, Math.min(plane.extent, x));
    }

    function moveTo(x, y) {
      q = [clamp(x), clamp(y)];
      render();
    }

    function fromPointer(e) {
      var m = svg.getScreenCTM();
      if (!m) return;
      var pt = svg.createSVGPoint();
      pt.x = e.clientX;
      pt.y = e.clientY;
      var u = pt.matrixTransform(m.inverse());
      moveTo((u.x - plane.pad) / unit - plane.extent, (plane.size - plane.pad - u.y) / unit - plane.extent);
    }

    var dragging = null;
    svg.addEventListener("pointerdown", function (e) {
      // Any pointer, touch included, grabs the query wherever it lands on the plane (the plane
      // does not scroll the page: Chrome ignores touch-action on the SVG handle itself).
      dragging = e.pointerId;
      svg.setPointerCapture(e.pointerId);
      handle.focus({ preventScroll: true });
      fromPointer(e);
      e.preventDefault();
    });
    svg.addEventListener("pointermove", function (e) {
      if (dragging === e.pointerId) fromPointer(e);
    });
    var stop = function (e) {
      if (dragging === e.pointerId) dragging = null;
    };
    svg.addEventListener("pointerup", stop);
    svg.addEventListener("pointercancel", stop);

    handle.addEventListener("keydown", function (e) {
      var step = e.shiftKey ? 0.25 : 0.05;
      var d = { ArrowLeft: [-step, 0], ArrowRight: [step, 0], ArrowUp: [0, step], ArrowDown: [0, -step] }[e.key];
      if (!d) return;
      e.preventDefault();
      moveTo(q[0] + d[0], q[1] + d[1]);
    });

    if (reset) {
      reset.addEventListener("click", function () {
        q = data.query.slice();
        render();
      });
    }
    var box = root.querySelector(".plane");
    if (box) box.hidden = false;
    var prompt = root.querySelector("[data-qkv-prompt]");
    var still = root.querySelector("[data-qkv-static-prompt]");
    if (prompt && still) {
      prompt.hidden = false;
      still.parentNode.removeChild(still);
    }
    if (reset) reset.hidden = false;
    placeQueryLabel(toScreen(q[0], q[1]));
  }

  WIDGETS["drag-query"] = setupDrag;
