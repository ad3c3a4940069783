"""The script of the HTML reports (inlined, no libraries): hovering or clicking a device
highlights it in every array and lists what it holds of each; clicking a collective shows
its cause. Text goes into the page through ``textContent`` only, never as markup. The script
sits inside the report's root element and looks only inside it, so several reports on one
page (a notebook's cells) each work on their own."""

from __future__ import annotations

JS = """
(function (root) {
  var info = root.querySelector('.info');
  var mesh = (info.getAttribute('data-mesh') || '').split(',').filter(Boolean)
    .map(function (p) { var kv = p.split(':'); return [kv[0], parseInt(kv[1], 10)]; });
  function clear(sel) {
    root.querySelectorAll(sel + '.hl').forEach(function (e) { e.classList.remove('hl'); });
  }
  function coords(k) {
    var out = [], rest = k;
    for (var i = mesh.length - 1; i >= 0; i--) {
      out.unshift(mesh[i][0] + ' ' + (rest % mesh[i][1]));
      rest = Math.floor(rest / mesh[i][1]);
    }
    return out.join(', ');
  }
  function show(title, sub, lines) {
    info.textContent = '';
    var h = document.createElement('h3');
    h.textContent = title;
    info.appendChild(h);
    if (sub) {
      var p = document.createElement('div');
      p.className = 'muted';
      p.textContent = sub;
      info.appendChild(p);
    }
    var ul = document.createElement('ul');
    lines.forEach(function (t) {
      var li = document.createElement('li');
      li.textContent = t;
      ul.appendChild(li);
    });
    info.appendChild(ul);
  }
  function device(k) {
    clear('.device');
    var seen = {}, lines = [], who = 'device ' + k;
    root.querySelectorAll('.device[data-device="' + k + '"]').forEach(function (r) {
      r.classList.add('hl');
      var t = r.querySelector('title').textContent, cut = t.indexOf(': ');
      who = t.slice(0, cut);
      var held = t.slice(cut + 2);
      if (!seen[held]) { seen[held] = 1; lines.push(held); }
    });
    show(who + ' holds', coords(parseInt(k, 10)), lines);
  }
  root.querySelectorAll('.device').forEach(function (r) {
    var k = r.getAttribute('data-device');
    r.addEventListener('mouseenter', function () { device(k); });
    r.addEventListener('click', function () { device(k); });
  });
  root.querySelectorAll('.coll').forEach(function (c) {
    c.addEventListener('click', function () {
      clear('.coll');
      c.classList.add('hl');
      show(c.getAttribute('data-what'), c.getAttribute('data-where'),
           [c.getAttribute('data-why')]);
    });
  });
})(document.currentScript.parentElement);
"""
