  /* ---------- block-walk widgets ---------- */

  /* One token through a Transformer block. The build embedded every state (states[order][token])
   * as the text the page shows, from the block's record, so a choice only writes that text: the
   * script never computes. The formulas come as the build's MathML. */
  function setupBlockWalk(root) {
    var data = json(root, "[data-qkv-data]");
    var controls = root.querySelector(".controls");
    if (!data || !controls) return;
    var picked = { order: 0, token: 0 };
    ["order", "token"].forEach(function (name) {
      root.querySelectorAll('[data-qkv-control="' + name + '"] input').forEach(function (input) {
        if (input.checked) picked[name] = Number(input.value);
        input.addEventListener("change", function () {
          picked[name] = Number(input.value);
          render(true);
        });
      });
    });
    var state = root.querySelector("[data-qkv-state]");
    var announce = root.querySelector("[data-qkv-announce]");

    function readout(name) {
      return root.querySelector('[data-qkv-readout="' + name + '"]');
    }

    function render(speak) {
      var s = data.states[picked.order][picked.token];
      s.vectors.forEach(function (v, k) {
        readout("formula:" + k).innerHTML = s.formulas[k];
        readout("vector:" + k).textContent = v;
        readout("length:" + k).textContent = s.lengths[k];
      });
      var order = data.orders[picked.order];
      var token = data.tokens[picked.token];
      root.setAttribute("data-qkv-order", order.split("-")[0]);
      root.setAttribute("data-qkv-token", token);
      var text = "Order: " + order + ". Token: " + token + ".";
      state.textContent = text;
      if (speak) {
        var last = s.vectors.length - 1;
        announce.textContent = text + " Output " + s.vectors[last] + ", length " + s.lengths[last] + ".";
      }
    }

    // A browser may restore other choices than the build's (back and forward): show those.
    render(false);
    controls.hidden = false;
  }

  WIDGETS["block-walk"] = setupBlockWalk;
