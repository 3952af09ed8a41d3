"""User-facing strings are marked for translation: models, fields, choices, admin labels, templates."""

from __future__ import annotations

import re
from pathlib import Path

from django.apps import apps
from django.contrib import admin
from django.utils.functional import Promise

TEMPLATES = Path(__file__).resolve().parents[1] / "streamrecover" / "templates"


def _models() -> list[type]:
    return list(apps.get_app_config("streamrecover").get_models())


def test_model_verbose_names_are_translatable() -> None:
    for model in _models():
        assert isinstance(model._meta.verbose_name, Promise), model
        assert isinstance(model._meta.verbose_name_plural, Promise), model


def test_field_verbose_names_help_texts_and_choices_are_translatable() -> None:
    for model in _models():
        for field in model._meta.get_fields():
            if field.auto_created or not field.concrete:  # reverse relations, the automatic id
                continue
            assert isinstance(field.verbose_name, Promise), (model.__name__, field.name)
            if field.help_text:
                assert isinstance(field.help_text, Promise), (model.__name__, field.name)
            for _value, label in field.choices or ():
                assert isinstance(label, Promise), (model.__name__, field.name, label)


def test_admin_labels_are_translatable() -> None:
    for model in _models():
        model_admin = admin.site._registry.get(model)
        if model_admin is None:
            continue
        if model_admin.search_help_text:
            assert isinstance(model_admin.search_help_text, Promise), model
        for name in (*model_admin.list_display, *model_admin.readonly_fields, *(model_admin.actions or ())):
            attr = getattr(model_admin, name, None) if isinstance(name, str) else name
            description = getattr(attr, "short_description", None)
            if description is not None:
                assert isinstance(description, Promise), (model.__name__, name)
        for list_filter in model_admin.list_filter:
            title = getattr(list_filter, "title", None)
            if title is not None and isinstance(list_filter, type):
                assert isinstance(title, Promise), (model.__name__, list_filter)


# What a reader sees: text outside tags, and the attributes a browser shows or reads aloud.
_I18N_TAGS = re.compile(r"\{% *blocktranslate.*?endblocktranslate *%\}|\{% *translate .*?%\}", re.S)
_TEMPLATE_TAGS = re.compile(r"\{%.*?%\}|\{\{.*?\}\}|\{#.*?#\}", re.S)
_SHOWN_ATTRS = re.compile(r'\b(?:title|aria-label|placeholder|alt)="([^"]*)"')
_HTML = re.compile(r"<[^>]*>")


def visible_untranslated(template: str) -> list[str]:
    text = re.sub(r"<(script|style)\b.*?</\1>", "", template, flags=re.S)
    # comments are for the template's readers, never shown
    text = re.sub(r"\{% comment %\}.*?\{% endcomment %\}|<!--.*?-->", "", text, flags=re.S)
    text = _TEMPLATE_TAGS.sub(" ", _I18N_TAGS.sub(" ", text))
    shown = _SHOWN_ATTRS.findall(text)
    words = _HTML.sub(" ", text).split("\n")
    # The product's name is not translated.
    return [s.strip() for s in [*shown, *words] if re.search(r"[A-Za-z]", s.replace("streamrecover", ""))]


def test_the_finder_sees_bare_text() -> None:
    assert visible_untranslated('<p>Hello <b>{{ name }}</b></p><a title="Open">{% translate "x" %}</a>') == [
        "Open",
        "Hello",
    ]
    assert visible_untranslated("<p>{% blocktranslate %}Hi {{ a }}{% endblocktranslate %}</p>") == []
    assert visible_untranslated("{% comment %}For readers.{% endcomment %}<!-- Also. --><p>Shown</p>") == ["Shown"]


def test_templates_translate_their_text() -> None:
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        if "translate" in text:  # a template with no text (a style sheet) needs no i18n
            loads = " ".join(re.findall(r"\{% load ([^%]*)%\}", text)).split()
            assert "i18n" in loads, path
        assert visible_untranslated(text) == [], path.name
