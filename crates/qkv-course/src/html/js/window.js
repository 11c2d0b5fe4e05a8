  /* ---------- window-alibi widgets ---------- */

  /* A window control and a slope control. The build embedded every state as the engine's
   * numbers, already shown at the widget's digits (states[window][slope]), so picking a state only
   * writes its text: the script never recomputes attention. */
  function setupWindowAlibi(root) {
    var data = json(root, "[data-qkv-data]");
    var controls = root.querySelector(".controls");
    if (!data || !controls) return;
    var picked = { window: 0, slope: 0 };
    ["window", "slope"].forEach(function (name) {
      root.querySelectorAll('[data-qkv-control="' + name + '"] input').forEach(function (input) {
        if (input.checked) picked[name] = Number(input.value);
        input.addEventListener("change", function () {
          picked[name] = Number(input.value);
          render(true);
        });
      });
    });
    var rows = data.queries;
    var cols = data.keys;
    var state = root.querySelector("[data-qkv-state]");
    var announce = root.querySelector("[data-qkv-announce]");

    function readout(name) {
      return root.querySelector('[data-qkv-readout="' + CSS.escape(name) + '"]');
    }

    /* A number, or a dash that reads "masked" where the key is hidden (the build writes the same). */
    function fill(td, text) {
      td.textContent = "";
      if (text === null) {
        td.setAttribute("data-qkv-masked", "");
        td.appendChild(el("span", { "aria-hidden": "true" }, "–"));
        td.appendChild(el("span", { class: "offscreen" }, "masked"));
      } else {
        td.removeAttribute("data-qkv-masked");
        td.textContent = text;
      }
    }

    function render(speak) {
      var s = data.states[picked.window][picked.slope];
      var said = [];
      rows.forEach(function (q, i) {
        cols.forEach(function (k, j) {
          fill(readout("bias:" + q + ":" + k), s.bias[i][j]);
          var cell = readout("weight:" + q + ":" + k);
          fill(cell, s.weights[i][j]);
          cell.style.setProperty("--w", s.shade[i][j].toFixed(4));
        });
        var out = s.output[i];
        if (out.length === 1) readout("output:" + q).textContent = out[0];
        else out.forEach(function (x, c) {
          readout("output:" + q + ":" + (c + 1)).textContent = x;
        });
        said.push(q + " " + out.join(", "));
      });
      root.setAttribute("data-qkv-window", data.attrs[picked.window]);
      root.setAttribute("data-qkv-slope", data.slopes[picked.slope]);
      var text = "Window: " + data.windows[picked.window] + ". ALiBi slope m = " + data.slopes[picked.slope] + ".";
      state.textContent = text;
      if (speak) announce.textContent = text + " Outputs: " + said.join("; ") + ".";
    }

    // A browser may restore other choices than the build's (back and forward): show those.
    render(false);
    controls.hidden = false;
  }

  WIDGETS["window-alibi"] = setupWindowAlibi;
