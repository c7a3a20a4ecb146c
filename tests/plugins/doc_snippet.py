#!/usr/bin/env python3
"""Extracts the fenced C block of a Markdown file that begins with
'/* NAME' (the plugin of docs/PLUGINS.md), so the guide's code is the code
the tests build. Usage: doc_snippet.py INPUT.md NAME OUTPUT.c"""
import re
import sys

src, name, dst = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(src, encoding='utf-8').read()
for block in re.findall(r'```c\n(.*?)```', text, flags=re.S):
    if block.startswith('/* ' + name):
        with open(dst, 'w', encoding='utf-8') as f:
            f.write('/* Generated from ' + src.split('/')[-1] + ' by doc_snippet.py: edit the guide. */\n')
            f.write(block)
        sys.exit(0)
sys.exit('doc_snippet.py: no ```c block starting with "/* %s" in %s' % (name, src))
